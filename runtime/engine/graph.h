// Forwarding header, temporary (issue 13): the format moved to format/graph.h. It stays only until
// engine.cu, engine.h, step.h and runtime/backend include "format/graph.h" themselves; then delete it.
#pragma once

#include "format/graph.h"
