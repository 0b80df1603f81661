"""The public headers <kiln/executorch/stats.h> (device memory, copy counters, per-op profile),
<kiln/executorch/version.h> and <kiln/executorch/api.h> (their export macro) are installed, compile
on their own as C and C++ without the CUDA headers, and declare what the installed backend library defines: a C++ app that links it reads
the versions and, with no engine loaded, zero totals and an empty profile. None of this needs a
GPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import INSTALL, require, run

HEADERS = ("stats.h", "version.h", "api.h")

CONSUMER = r"""
#include <kiln/executorch/stats.h>
#include <kiln/executorch/stream.h>
#include <kiln/executorch/version.h>
#include <cstdio>
#include <cstring>
int main() {
  if (kiln_executorch_backend_registered() != 1) return 1;
  if (std::strlen(kiln_executorch_version()) == 0 || std::strlen(kiln_executorch_built_against()) == 0) return 2;
  if (kiln_executorch_weight_bytes() != 0 || kiln_executorch_weight_allocated_bytes() != 0 ||
      kiln_executorch_weight_requested_bytes() != 0 || kiln_executorch_activation_bytes() != 0) return 3;
  uint64_t h2d = 1, d2h = 1, executes = 1;
  kiln_executorch_copy_counters(&h2d, &d2h, &executes);
  kiln_executorch_copy_counters(nullptr, nullptr, nullptr);
  if (h2d != 0 || d2h != 0 || executes != 0) return 4;
  kiln_executorch_set_profiling(1);
  kiln_executorch_reset_profile();
  char buffer[8] = "x";
  if (kiln_executorch_profile_report(buffer, sizeof(buffer)) != 0 || buffer[0] != '\0') return 5;
  if (kiln_executorch_profile_total_ms() != 0.0) return 6;
  kiln_executorch_set_profiling(0);
  std::printf("stats api ok %s\n", kiln_executorch_version());
  return 0;
}
"""


def include_dir() -> Path:
    for name in HEADERS:
        require(INSTALL / "include" / "kiln" / "executorch" / name,
                "cmake --install build --prefix build/install/kiln_executorch (scripts/setup.sh does it)")
    return INSTALL / "include"


@pytest.mark.parametrize("name", HEADERS)
def test_header_needs_only_the_c_library(name):
    text = (include_dir() / "kiln" / "executorch" / name).read_text()
    assert set(re.findall(r"#include <([^>]+)>", text)) <= {"stddef.h", "stdint.h", "kiln/executorch/api.h"}, text


@pytest.mark.parametrize("name", HEADERS)
@pytest.mark.parametrize("compiler,std,suffix", [("gcc", "-std=c11", "c"), ("g++", "-std=c++17", "cpp")])
def test_header_compiles_alone(name, compiler, std, suffix, tmp_path):
    src = tmp_path / f"main.{suffix}"
    src.write_text(f"#include <kiln/executorch/{name}>\n#include <kiln/executorch/stream.h>\n"
                   "int main(void) { return 0; }\n")
    b = run([compiler, std, "-Wall", "-Wextra", "-Werror", "-c", f"-I{include_dir()}", src,
             "-o", tmp_path / "main.o"])
    assert b.returncode == 0, b.stderr


def test_every_function_the_headers_declare_is_exported():
    declared = set()
    for name in HEADERS:
        declared |= set(re.findall(r"KILN_EXECUTORCH_API [^;(]*?\b(kiln_executorch_\w+)\(",
                                   (include_dir() / "kiln" / "executorch" / name).read_text()))
    lib = require(INSTALL / "lib" / "libkiln_executorch_backend.so", "run scripts/setup.sh")
    exported = {l.split()[-1] for l in run(["nm", "-D", "--defined-only", lib]).stdout.splitlines()}
    assert len(declared) == 12 and declared <= exported, declared - exported


def test_cpp_consumer_reads_the_stats(site, tmp_path):
    src = tmp_path / "main.cpp"
    src.write_text(CONSUMER)
    lib = site / "kiln_executorch" / "lib" / "libkiln_executorch_backend.so"
    exe = tmp_path / "consumer"
    b = run(["g++", "-std=c++17", "-Wall", "-Werror", f"-I{site / 'kiln_executorch' / 'include'}", src,
             "-o", exe, f"-Wl,--push-state,--no-as-needed,{lib},--pop-state", f"-Wl,-rpath,{lib.parent}"])
    assert b.returncode == 0, b.stderr
    r = run([exe])
    assert r.returncode == 0 and "stats api ok" in r.stdout, (r.returncode, r.stdout, r.stderr)
