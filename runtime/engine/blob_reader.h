// Forwarding header, temporary (issue 13): the format moved to format/blob_reader.h. It stays only until
// engine.cu, engine.h, step.h and runtime/backend include "format/blob_reader.h" themselves; then delete it.
#pragma once

#include "format/blob_reader.h"
