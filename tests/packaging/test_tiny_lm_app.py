"""examples/tiny_lm's C++ app builds from the installed Kiln the way examples/cpp_consumer does,
and without a GPU it fails cleanly (a message and exit code 1, not a crash). The GPU run is in
tests/gpu_e2e/check_kv_cache.py."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, build_example, run

ET_ROOT = Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0])
KILN_ROOT = ET_ROOT.parent / "kiln_executorch"


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    assert (KILN_ROOT / "lib" / "cmake" / "kiln_executorch").is_dir(), \
        f"{KILN_ROOT} has no CMake package: scripts/setup.sh installs the kiln_executorch wheel"
    build = build_example("tiny_lm", tmp_path_factory.mktemp("tiny_lm"), ET_ROOT.parent)
    return build / "tiny_lm"


def test_usage_without_arguments(app):
    r = run([app])
    assert r.returncode == 2 and "usage: tiny_lm" in r.stderr


def test_generates_eager_tokens_or_fails_cleanly_without_a_gpu(app, tmp_path):
    r = subprocess.run([sys.executable, REPO / "examples" / "tiny_lm" / "export_tiny_lm.py",
                        "--out", tmp_path, "--new-tokens", "4"], capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(REPO / "python"),
                                         "KILN_SKIP_DELEGATE_REGISTRATION": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    prompt = (tmp_path / "prompt.txt").read_text().strip()
    expect = (tmp_path / "expected_tokens.txt").read_text().strip()
    r = run([app, tmp_path / "tiny_lm.pte", "--prompt", prompt, "--new-tokens", "4",
             "--expect", expect])
    if "no usable CUDA device" in r.stderr:      # a machine without a usable GPU
        assert r.returncode == 1 and "cannot load 'forward'" in r.stderr, r.stdout + r.stderr
    else:
        assert r.returncode == 0 and "matches eager greedy tokens: yes" in r.stdout, \
            r.stdout + r.stderr
