// Forwarding header, temporary (issue 13): the format moved to format/variant_set_reader.h. It stays only until
// engine.cu, engine.h, step.h and runtime/backend include "format/variant_set_reader.h" themselves; then delete it.
#pragma once

#include "format/variant_set_reader.h"
