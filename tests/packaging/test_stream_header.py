"""The public header <kiln/executorch/stream.h> is installed, compiles in consumers (a C++ app
that only includes it, a C translation unit, and examples/device_resident through the CMake
package), and its functions come from the installed backend library: per-thread, restored by the
guard. None of this needs a GPU."""
from __future__ import annotations

import re
import subprocess

from conftest import INSTALL, build_example, require, run

CONSUMER = r"""
#include <kiln/executorch/stream.h>
#include <cstdio>
#include <thread>
int main() {
  CUstream_st* a = reinterpret_cast<CUstream_st*>(0x10);
  CUstream_st* b = reinterpret_cast<CUstream_st*>(0x20);
  if (kiln_executorch_current_stream() != nullptr) return 1;
  {
    kiln::ScopedStream outer(a);
    {
      kiln::ScopedStream inner(b);
      if (kiln_executorch_current_stream() != b) return 2;
    }
    if (kiln_executorch_current_stream() != a) return 3;
    CUstream_st* seen = a;
    std::thread([&] { seen = kiln_executorch_current_stream(); }).join();
    if (seen != nullptr) return 4;
  }
  if (kiln_executorch_current_stream() != nullptr) return 5;
  std::puts("stream api ok");
  return 0;
}
"""


def test_header_is_installed_and_needs_no_cuda_headers():
    text = require(INSTALL / "include" / "kiln" / "executorch" / "stream.h", "cmake --install").read_text()
    assert re.findall(r"#include\s*(\S+)", text) == ["<kiln/executorch/api.h>"], text
    prose = " ".join(line.lstrip("/ ").strip() for line in text.splitlines())
    for phrase in ("returns as soon as the work is enqueued", "cudaStreamSynchronize(stream)",
                   "returns after the stream has finished", "thread_local"):
        assert phrase in prose, phrase


def test_cpp_consumer_uses_the_api(site, tmp_path):
    src = tmp_path / "main.cpp"
    src.write_text(CONSUMER)
    lib = site / "kiln_executorch" / "lib" / "libkiln_executorch_backend.so"
    exe = tmp_path / "consumer"
    b = run(["g++", "-std=c++17", "-Wall", "-Werror", f"-I{site / 'kiln_executorch' / 'include'}",
             src, "-o", exe, f"-Wl,--push-state,--no-as-needed,{lib},--pop-state",
             f"-Wl,-rpath,{lib.parent}", "-pthread"])
    assert b.returncode == 0, b.stderr
    r = run([exe])
    assert r.returncode == 0 and "stream api ok" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_header_compiles_as_c(site, tmp_path):
    src = tmp_path / "main.c"
    src.write_text("#include <kiln/executorch/stream.h>\n"
                   "int main(void) { return kiln_executorch_current_stream() != 0; }\n")
    b = run(["gcc", "-std=c11", "-Wall", "-Werror", "-c", f"-I{site / 'kiln_executorch' / 'include'}",
             src, "-o", tmp_path / "main.o"])
    assert b.returncode == 0, b.stderr


def test_device_resident_example_builds_from_the_package(site, tmp_path):
    build_example("device_resident", tmp_path, site)
    needed = subprocess.run(["readelf", "-d", tmp_path / "device_resident"], capture_output=True,
                            text=True).stdout
    assert "[libkiln_executorch_backend.so]" in needed, needed
