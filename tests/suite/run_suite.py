"""Runs ExecuTorch's backend test suite (the copy in the pinned executorch wheel, unedited) with
the kiln flow (python/kiln_testing/backend_suite.py, a pytest plugin):

    run_suite.py [--suite operators|models] [--out DIR] [--subset ci | --files F1,F2]
                 [pytest arguments...]

Every case is lowered with KilnPartitioner and serialized; the lowered program runs on the CPU
through the reference interpreter against eager PyTorch (the Kiln delegate needs the GPU; the
H200 run is tests/gpu_e2e/check_suite.py). A lowering error, a mismatch or a crash fails the run
(pytest's exit status is returned). --out DIR: results.jsonl (one line per subtest, for
bench/suite_summary.py) and the staged programs with manifest.json (for check_suite.py).
--subset ci: the deterministic part of the operator suite that CI runs (CI_FILES below).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The operator tests CI lowers (tests/suite/test_backend_suite.py): one file per operator family
# (elementwise, reduction, matmul/conv, pooling, shape, indexing), chosen to keep CI's share
# short; run_suite.py without --subset runs all of them.
CI_FILES = ["test_add.py", "test_mul.py", "test_exp.py", "test_sigmoid.py", "test_amax.py",
            "test_mean.py", "test_linear.py", "test_conv2d.py", "test_avgpool2d.py",
            "test_maxpool2d.py", "test_permute.py", "test_cat.py", "test_slice.py",
            "test_embedding.py", "test_gelu.py", "test_reshape.py"]


def suite_dir() -> Path:
    spec = importlib.util.find_spec("executorch")
    return Path(list(spec.submodule_search_locations)[0]) / "backends" / "test" / "suite"


def command(suite: str, out: Path | None, subset: str | None, extra: list[str],
            files: list[str] | None = None) -> list[str]:
    root = suite_dir() / suite
    files = CI_FILES if subset == "ci" else files
    paths = [root / f for f in files] if files else [root]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise SystemExit(f"run_suite: not in the executorch wheel: {', '.join(missing)}")
    # -p no:cacheprovider: nothing is written into the wheel's folder; the repository's own
    # tests/conftest.py is not on these paths, so its fixtures stay out.
    # The suite's conftest.py (its test_runner fixture) sits above the test folders: rootdir and
    # confcutdir at the suite's folder so pytest loads it however the paths are given.
    return [sys.executable, "-m", "pytest", *map(str, paths), "-p", "kiln_testing.backend_suite",
            f"--rootdir={suite_dir()}", f"--confcutdir={suite_dir()}", "-p", "no:cacheprovider", "-q", "-W", "ignore::DeprecationWarning",
            *(["--kiln-out", str(out)] if out else []), *extra]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=["operators", "models"], default="operators")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--subset", choices=["ci"])
    ap.add_argument("--files", help="comma list of the suite's test files to run (default: all)")
    args, extra = ap.parse_known_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory() as cwd:  # rootdir detection stays out of the repository
        return subprocess.call(command(args.suite, args.out and args.out.resolve(), args.subset,
                                       extra, args.files and args.files.split(",")),
                               cwd=cwd, env=env)


if __name__ == "__main__":
    sys.exit(main())
