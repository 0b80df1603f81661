// One entry point for the fuzzer and the corpus replay: an input that starts with the variant set
// magic goes through read_variant_set (which reads every variant blob), anything else through
// read_blob; an accepted input's graphs are held to graph.h's promise (graph_contract.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/blob_reader.h"
#include "format/variant_set_reader.h"
#include "tests/fuzz/graph_contract.h"

namespace kiln::engine::fuzz {

struct ReadResult {
  executorch::runtime::Error error = executorch::runtime::Error::Ok;
  std::string why;     // the reader's message when error != Ok
  std::string broken;  // for an accepted input: the contract a graph breaks, or empty
};

inline ReadResult read_any(const uint8_t* data, size_t size) {
  ReadResult r;
  if (!is_variant_set(data, size)) {
    auto graph = read_blob(data, size, &r.why);
    if (!graph.ok()) {
      r.error = graph.error();
    } else {
      r.broken = check_graph_contract(graph.get(), data, size);
    }
    return r;
  }
  auto set = read_variant_set(data, size, &r.why);
  if (!set.ok()) {
    r.error = set.error();
    return r;
  }
  for (size_t v = 0; v < set->variants.size() && r.broken.empty(); ++v) {
    const Variant& variant = set->variants[v];
    std::string why;
    auto graph = read_blob(variant.blob, variant.blob_size, &why, &set->weights);
    if (!graph.ok()) {
      r.broken = "variant " + std::to_string(v) + " passed the set's reader but not read_blob: " + why;
    } else {
      // The container bounds every borrowed pointer, the shared weights included.
      r.broken = check_graph_contract(graph.get(), data, size);
    }
  }
  return r;
}

}  // namespace kiln::engine::fuzz
