// What Kiln's public C headers share (<kiln/executorch/stream.h>, stats.h, version.h):
// KILN_EXECUTORCH_API marks the functions libkiln_executorch_backend.so exports. C and C++; needs
// no other header.
#pragma once

#if defined(__GNUC__)
#define KILN_EXECUTORCH_API __attribute__((visibility("default")))
#else
#define KILN_EXECUTORCH_API
#endif
