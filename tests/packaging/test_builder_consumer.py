"""A C++ tool uses the installed AOT builder through the CMake package (kiln::builder and
<kiln/builder.h>): it builds a blob from a hand-written IR buffer and gets a message for a bad one.
Built against the install tree (build/install/kiln_executorch) beside the executorch wheel."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from conftest import BUILD, CMAKE, REPO, require, run

INSTALL = BUILD / "install" / "kiln_executorch"
ET_ROOT = Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0])

CMAKELISTS = """cmake_minimum_required(VERSION 3.28)
project(builder_tool LANGUAGES CXX)
find_package(executorch CONFIG REQUIRED)
find_package(kiln_executorch CONFIG REQUIRED)
add_executable(tool main.cpp)
target_link_libraries(tool PRIVATE kiln::builder)
"""

# One float input [4], relu into an unplanned arena tensor that is the output: the builder binds
# it to the output, plans nothing, and writes a blob the runtime's reader accepts.
MAIN = r"""
#include <kiln/builder.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

template <typename T> void put(std::vector<unsigned char>& b, T v) {
  unsigned char* p = reinterpret_cast<unsigned char*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

void tensor(std::vector<unsigned char>& b, unsigned storage) {
  put<unsigned>(b, 6); put<unsigned>(b, 1); put<long long>(b, 4);
  for (int i = 1; i < 8; ++i) put<long long>(b, 0);
  put<unsigned>(b, storage); put<int>(b, -1); put<unsigned long long>(b, 0);
  put<unsigned long long>(b, 0); put<unsigned>(b, 0); put<unsigned>(b, 0);
}

int main() {
  std::vector<unsigned char> body;
  tensor(body, 2);   // input 0
  tensor(body, 0);   // arena
  put<unsigned>(body, 3); put<unsigned>(body, 5);                  // kUnary, 5 operands
  long long ops[5] = {0, 0, 1, 0, 0};                              // relu(x=0) -> out=1
  for (long long v : ops) put<long long>(body, v);
  put<unsigned>(body, 0); put<unsigned>(body, 1);                  // io: input 0, output 1
  std::vector<unsigned char> ir(KILN_IR_MAGIC, KILN_IR_MAGIC + 8);
  put<unsigned>(ir, KILN_IR_VERSION); put<unsigned>(ir, KILN_IR_HEADER_SIZE); put<unsigned>(ir, 0);
  put<unsigned>(ir, 2); put<unsigned>(ir, 1); put<unsigned>(ir, 1); put<unsigned>(ir, 1);
  put<unsigned>(ir, 0); put<unsigned long long>(ir, 5); put<unsigned long long>(ir, 0);
  put<unsigned long long>(ir, KILN_IR_HEADER_SIZE + body.size());
  ir.insert(ir.end(), body.begin(), body.end());

  void* blob = nullptr;
  size_t size = 0;
  char error[256];
  int rc = kiln_builder_build_blob(ir.data(), ir.size(), KILN_BUILDER_PASSES_ALL, &blob, &size,
                                   error, sizeof(error));
  if (rc != KILN_BUILDER_OK) { std::printf("error %d: %s\n", rc, error); return 1; }
  std::printf("api %u blob %zu bytes magic %.8s\n", kiln_builder_api_version(), size,
              static_cast<char*>(blob));
  const char* format = kiln_builder_format_description();
  std::printf("format %.42s\n", format == nullptr ? "(none)" : format);
  kiln_builder_free(blob);
  ir[0] = 'X';
  rc = kiln_builder_build_blob(ir.data(), ir.size(), KILN_BUILDER_PASSES_ALL, &blob, &size, error,
                               sizeof(error));
  std::printf("bad: %d %s\n", rc, error);
  return 0;
}
"""


def test_cpp_tool_builds_a_blob_through_the_cmake_package(tmp_path):
    require(INSTALL / "lib" / "libkiln_builder.so", "run scripts/setup.sh (it installs the build)")
    # The wheel's layout: kiln_executorch beside executorch (the builder's RUNPATH reaches
    # ../../executorch/lib from its own folder).
    site = tmp_path / "site"
    site.mkdir()
    shutil.copytree(INSTALL, site / "kiln_executorch")
    (site / "executorch").symlink_to(ET_ROOT, target_is_directory=True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    (src / "main.cpp").write_text(MAIN)
    build = tmp_path / "build"
    prefix = f"{site / 'kiln_executorch'};{site / 'executorch' / 'lib' / 'cmake' / 'executorch'}"
    cfg = run([CMAKE, "-S", src, "-B", build, "-G", "Ninja",
               f"-DCMAKE_MAKE_PROGRAM={REPO / '.venv' / 'bin' / 'ninja'}",
               f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    b = run([CMAKE, "--build", build])
    assert b.returncode == 0, b.stdout + b.stderr
    r = run([build / "tool"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "api 2 blob" in r.stdout and "magic KILNBLOB" in r.stdout, r.stdout
    assert 'format {"magic": "KILNBLOB", "format_version": 4' in r.stdout, r.stdout
    assert "bad: 1 IR magic is not KILNIR" in r.stdout, r.stdout
