// Keeps the engine's libstdc++ needs within libexecutorch.so's (GLIBCXX_3.4.21, checked by
// tests/packaging): the cuDNN frontend's headers default-construct string streams, and since
// GCC 9 those default constructors are separate symbols of libstdc++ 3.4.26. These hidden
// definitions, under the same symbol names, stand in for them inside Kiln's own libraries; each
// is the stream's open-mode constructor with the default's mode, which is what the standard
// defines the default constructor to be.
#include <new>
#include <sstream>

extern "C" __attribute__((visibility("hidden"))) void kiln_default_stringstream(void* self) __asm__(
    "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev");
extern "C" __attribute__((visibility("hidden"))) void kiln_default_ostringstream(void* self)
    __asm__("_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev");

void kiln_default_stringstream(void* self) {
  new (self) std::stringstream(std::ios_base::in | std::ios_base::out);
}

void kiln_default_ostringstream(void* self) { new (self) std::ostringstream(std::ios_base::out); }
