// Forwarding header, temporary (issue 13): the format moved to format/fail.h. It stays only until
// engine.cu, engine.h, step.h and runtime/backend include "format/fail.h" themselves; then delete it.
#pragma once

#include "format/fail.h"
