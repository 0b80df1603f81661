// kiln_llm: token generation with a program kiln_executorch.llm.export_llm wrote (methods prefill
// and decode sharing the KV cache in Kiln's GPU state; constant methods max_context,
// prefill_length and vocab_size). Token ids in, token ids out; no tokenizer.
//
//   kiln_llm model.pte (--prompt "1 72 105" | --prompt-file FILE) [--new-tokens N]
//            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--output FILE]
//            [--expect "ids"] [--force "ids"] [--logits FILE] [--warmup N] [--repeats R]
//            [--quiet]
//
// The prompt runs through prefill in chunks of prefill_length tokens (the last one padded), then
// decode runs once per new token. Greedy unless --temperature, --top-k or --top-p is given (then
// a draw seeded by --seed). Prints the prefill time, decode ms per token (execute only) and
// tokens/s (whole steps: execute, logits to the host, sampling), a progress line on stderr, and
// the tokens. Before the timed run, --warmup (default 2) untimed prefills of the prompt and decode
// steps run: a delegate's first execute loads its kernels and builds its library plans, its second
// captures the CUDA graph it replays from then on (the first prefill's time is printed too). They
// write the cache rows the timed run writes again, so the tokens do not change. --repeats R times
// the prompt's prefill R times and prints the median. --force feeds the given tokens to decode
// instead of the sampled ones (teacher forcing: compare logits step by step with another model's
// run of the same tokens) and --logits writes every step's float32 logits to FILE, one row per
// step; --output writes them to a file, --expect compares them (exit 1 when they differ).
// A prompt that does not fit the cache, a token id outside the vocabulary or a bad option is an
// error before anything runs. Program loading is kiln_runner's (program_loader.h).

#include <executorch/runtime/core/exec_aten/exec_aten.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runner/diagnostics.h"
#include "runner/program_loader.h"
#include "runner/sampler.h"

namespace kiln::runner {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::TensorImpl;
using Clock = std::chrono::steady_clock;

constexpr const char* kLlmUsage =
    "usage: kiln_llm model.pte (--prompt \"ids\" | --prompt-file FILE) [--new-tokens N]\n"
    "                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--output FILE]\n"
    "                [--expect \"ids\"] [--force \"ids\"] [--logits FILE] [--warmup N]\n"
    "                [--repeats R] [--quiet]\n";

struct LlmOptions {
  std::string model;
  std::vector<int64_t> prompt;
  bool have_prompt = false;
  int64_t new_tokens = 32;
  SamplingOptions sampling;
  std::string output;
  std::vector<int64_t> expect;
  bool have_expect = false;
  std::vector<int64_t> force;
  std::string logits_file;
  int64_t warmup = 2;
  int64_t repeats = 1;
  bool quiet = false;
};

bool parse_ids(const std::string& text, std::vector<int64_t>& out) {
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (end == word.c_str() || *end != '\0') return false;
    out.push_back(v);
  }
  return true;
}

bool parse_into(int argc, char** argv, LlmOptions& o, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        error = std::string(name) + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* name, double& out) {
      const char* v = value(name);
      if (v == nullptr) return false;
      char* end = nullptr;
      out = std::strtod(v, &end);
      if (end == v || *end != '\0') {
        error = std::string(name) + " takes a number, got '" + v + "'";
        return false;
      }
      return true;
    };
    double x = 0;
    if (a == "--prompt" || a == "--expect" || a == "--force") {
      const char* v = value(a.c_str());
      if (v == nullptr) return false;
      std::vector<int64_t>& ids = a == "--prompt" ? o.prompt : a == "--expect" ? o.expect : o.force;
      if (!parse_ids(v, ids)) {
        error = a + " takes space-separated token ids, got '" + v + "'";
        return false;
      }
      if (a != "--force") (a == "--prompt" ? o.have_prompt : o.have_expect) = true;
    } else if (a == "--prompt-file") {
      const char* v = value("--prompt-file");
      if (v == nullptr) return false;
      std::ifstream in(v);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || !parse_ids(text.str(), o.prompt)) {
        error = std::string("--prompt-file ") + v + ": cannot read space-separated token ids";
        return false;
      }
      o.have_prompt = true;
    } else if (a == "--new-tokens") {
      if (!number("--new-tokens", x)) return false;
      o.new_tokens = static_cast<int64_t>(x);
      if (x < 1 || x != double(o.new_tokens)) {
        error = "--new-tokens must be a positive integer";
        return false;
      }
    } else if (a == "--warmup" || a == "--repeats") {
      if (!number(a.c_str(), x)) return false;
      const int64_t v = static_cast<int64_t>(x);
      if (x != double(v) || v < (a == "--warmup" ? 0 : 1)) {
        error = a + (a == "--warmup" ? " must be an integer >= 0" : " must be a positive integer");
        return false;
      }
      (a == "--warmup" ? o.warmup : o.repeats) = v;
    } else if (a == "--temperature" || a == "--top-k" || a == "--top-p") {
      if (!number(a.c_str(), x)) return false;
      if (a == "--temperature") o.sampling.temperature = x;
      else if (a == "--top-p") o.sampling.top_p = x;
      else o.sampling.top_k = static_cast<int64_t>(x);
      o.sampling.greedy = false;
    } else if (a == "--seed") {
      if (!number("--seed", x)) return false;
      o.sampling.seed = static_cast<uint64_t>(x);
    } else if (a == "--output") {
      const char* v = value("--output");
      if (v == nullptr) return false;
      o.output = v;
    } else if (a == "--logits") {
      const char* v = value("--logits");
      if (v == nullptr) return false;
      o.logits_file = v;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else if (!a.empty() && a[0] == '-') {
      error = "unknown option " + a;
      return false;
    } else if (o.model.empty()) {
      o.model = a;
    } else {
      error = "more than one model given ('" + o.model + "', '" + a + "')";
      return false;
    }
  }
  if (o.model.empty()) error = "no model given";
  else if (!o.have_prompt || o.prompt.empty()) error = "no prompt: give --prompt or --prompt-file";
  else error = check_sampling(o.sampling);
  return error.empty();
}

// An int64 host tensor the runner owns, handed to a method input.
struct IdTensor {
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::vector<int64_t> data;
  std::unique_ptr<TensorImpl> impl;

  explicit IdTensor(std::vector<TensorImpl::SizesType> shape) : sizes(std::move(shape)) {
    size_t n = 1;
    for (auto s : sizes) n *= size_t(s);
    data.assign(n, 0);
    for (size_t d = 0; d < sizes.size(); ++d) dim_order.push_back(TensorImpl::DimOrderType(d));
    impl = std::make_unique<TensorImpl>(ScalarType::Long, ssize_t(sizes.size()), sizes.data(),
                                        data.data(), dim_order.data());
  }
};

// The value a constant method (max_context, prefill_length, vocab_size) returns.
int64_t constant(et::Program& program, const char* name, const std::string& model) {
  LoadedMethod m(program, name, model);
  et::Error err = m.method().execute();
  if (err != et::Error::Ok) fail(std::string("execute('") + name + "')", err);
  const et::EValue& v = m.method().get_output(0);
  if (!v.isInt()) {
    fail(std::string("'") + name + "' returns no integer: '" + model + "' was not written by "
         "kiln_executorch.llm.export_llm");
  }
  return v.toInt();
}

// Input `index` of `method` must be an int64 tensor of `sizes`; otherwise the program is not one
// export_llm wrote (or was exported with other sizes than its constant methods say).
void expect_input(const et::MethodMeta& meta, const char* method, size_t index,
                  const std::vector<int64_t>& sizes) {
  auto info = meta.input_tensor_meta(index);
  bool ok = info.ok() && info->scalar_type() == ScalarType::Long &&
            info->sizes().size() == sizes.size();
  for (size_t d = 0; ok && d < sizes.size(); ++d) ok = info->sizes()[d] == sizes[d];
  if (!ok || meta.num_inputs() <= index) {
    std::string want = "[";
    for (size_t d = 0; d < sizes.size(); ++d) want += (d ? "," : "") + std::to_string(sizes[d]);
    fail(std::string("method '") + method + "' input " + std::to_string(index) +
         " is not an int64 tensor " + want + "]; export the program with "
         "kiln_executorch.llm.export_llm");
  }
}

// Runs `method` on `inputs`; returns its float logits (a view of its output, valid until the next
// execute). `what` names the step in a failure.
const float* run(LoadedMethod& m, std::vector<IdTensor*> inputs, int64_t vocab,
                 const std::string& what) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    executorch::aten::Tensor t(inputs[i]->impl.get());
    et::Error err = m.method().set_input(et::EValue(t), i);
    if (err != et::Error::Ok) fail(what + ": set_input(" + std::to_string(i) + ")", err);
  }
  et::Error err = m.method().execute();
  if (err != et::Error::Ok) fail(what, err);
  const et::EValue& out = m.method().get_output(0);
  if (!out.isTensor() || out.toTensor().scalar_type() != ScalarType::Float ||
      out.toTensor().numel() != vocab) {
    fail(what + ": the output is not float32 logits of " + std::to_string(vocab) + " values");
  }
  return out.toTensor().const_data_ptr<float>();
}

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Parses the command line; on a bad one prints why and the usage.
bool parse(int argc, char** argv, LlmOptions& o) {
  std::string error;
  if (parse_into(argc, argv, o, error)) return true;
  std::fprintf(stderr, "kiln_llm: %s\n%s", error.c_str(), kLlmUsage);
  return false;
}

int llm_main(int argc, char** argv) {
  set_tool_name("kiln_llm");
  LlmOptions o;
  if (!parse(argc, argv, o)) return 2;
  start_runtime();

  LoadedProgram loaded = load_program(o.model);
  et::Program& program = *loaded.program;
  const int64_t max_context = constant(program, "max_context", o.model);
  const int64_t chunk = constant(program, "prefill_length", o.model);
  const int64_t vocab = constant(program, "vocab_size", o.model);
  const int64_t n = static_cast<int64_t>(o.prompt.size());
  for (const auto* ids : {&o.prompt, &o.force}) {
    for (int64_t id : *ids) {
      if (id < 0 || id >= vocab) {
        fail(std::string(ids == &o.prompt ? "prompt" : "--force") + " token " +
             std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      }
    }
  }
  if (!o.force.empty() && int64_t(o.force.size()) < o.new_tokens - 1) {
    fail("--force gives " + std::to_string(o.force.size()) + " tokens; " +
         std::to_string(o.new_tokens) + " new tokens feed " + std::to_string(o.new_tokens - 1) +
         " to decode");
  }
  if (n + o.new_tokens > max_context) {
    fail("a prompt of " + std::to_string(n) + " tokens and " + std::to_string(o.new_tokens) +
         " new tokens need " + std::to_string(n + o.new_tokens) + " cache rows; the program's "
         "cache has " + std::to_string(max_context) + " (export with a larger max_context)");
  }
  const int64_t last_start = (n - 1) / chunk * chunk;
  if (last_start + chunk > max_context) {
    fail("the prompt's last prefill chunk (rows " + std::to_string(last_start) + ".." +
         std::to_string(last_start + chunk - 1) + ", padded to prefill_length " +
         std::to_string(chunk) + ") ends past the cache's " + std::to_string(max_context) +
         " rows; shorten the prompt to " + std::to_string(max_context / chunk * chunk) +
         " tokens or fewer");
  }

  // Both methods of this one loaded program: Kiln gives them one KV cache on the device.
  LoadedMethod prefill(program, "prefill", o.model);
  LoadedMethod decode(program, "decode", o.model);
  expect_input(prefill.meta(), "prefill", 0, {1, chunk});
  expect_input(prefill.meta(), "prefill", 1, {chunk});
  expect_input(prefill.meta(), "prefill", 2, {1});
  expect_input(decode.meta(), "decode", 0, {1, 1});
  expect_input(decode.meta(), "decode", 1, {1});
  std::printf("model %s: max_context=%lld prefill_length=%lld vocab=%lld load_ms prefill=%.1f "
              "decode=%.1f\n", o.model.c_str(), (long long)max_context, (long long)chunk,
              (long long)vocab, prefill.load_ms(), decode.load_ms());

  IdTensor tokens({1, TensorImpl::SizesType(chunk)}), positions({TensorImpl::SizesType(chunk)});
  IdTensor last({1}), token({1, 1}), position({1});
  Sampler sampler(o.sampling);
  // One prefill of the whole prompt, chunk by chunk; returns the last chunk's logits.
  const int64_t chunks = (n + chunk - 1) / chunk;
  auto prefill_prompt = [&]() {
    const float* logits = nullptr;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t real = std::min(chunk, n - start);
      for (int64_t i = 0; i < chunk; ++i) {
        tokens.data[size_t(i)] = i < real ? o.prompt[size_t(start + i)] : 0;  // pad: any id
        positions.data[size_t(i)] = start + i;
      }
      last.data[0] = real - 1;
      logits = run(prefill, {&tokens, &positions, &last}, vocab,
                   "prefill of prompt rows " + std::to_string(start) + ".." +
                       std::to_string(start + real - 1));
    }
    return logits;
  };
  // Warm-up: the decode steps write row n, which the first timed decode step writes again
  // before anything reads it.
  double first_prefill_ms = -1;
  for (int64_t w = 0; w < o.warmup; ++w) {
    const auto t0 = Clock::now();
    prefill_prompt();
    if (w == 0) first_prefill_ms = ms_since(t0);
    if (o.new_tokens > 1) {
      token.data[0] = 0;
      position.data[0] = n;
      run(decode, {&token, &position}, vocab, "warm-up decode at position " + std::to_string(n));
    }
  }
  std::vector<double> prefill_times;
  const float* logits = nullptr;
  for (int64_t r = 0; r < o.repeats; ++r) {
    const auto t0 = Clock::now();
    logits = prefill_prompt();
    prefill_times.push_back(ms_since(t0));
  }
  std::vector<float> all_logits;   // --logits: one row per step
  auto keep_logits = [&](const float* l) {
    if (!o.logits_file.empty()) all_logits.insert(all_logits.end(), l, l + vocab);
  };
  keep_logits(logits);
  std::vector<int64_t> out{sampler.next(logits, size_t(vocab))};
  std::sort(prefill_times.begin(), prefill_times.end());
  const double prefill_ms = prefill_times[prefill_times.size() / 2];

  double execute_ms = 0;
  const auto decode_start = Clock::now();
  for (int64_t step = 1; step < o.new_tokens; ++step) {
    token.data[0] = o.force.empty() ? out.back() : o.force[size_t(step - 1)];
    position.data[0] = n + step - 1;
    const auto t0 = Clock::now();
    logits = run(decode, {&token, &position}, vocab,
                 "decode at position " + std::to_string(position.data[0]));
    execute_ms += ms_since(t0);
    keep_logits(logits);
    out.push_back(sampler.next(logits, size_t(vocab)));
    if (!o.quiet && (step % 16 == 0 || step + 1 == o.new_tokens)) {
      std::fprintf(stderr, "\rkiln_llm: %lld/%lld tokens, %.3f ms/token", (long long)(step + 1),
                   (long long)o.new_tokens, execute_ms / double(step));
    }
  }
  const double decode_ms = ms_since(decode_start);
  const int64_t steps = o.new_tokens - 1;
  if (!o.quiet && steps > 0) std::fprintf(stderr, "\n");

  std::printf("prompt_tokens=%lld new_tokens=%lld prefill_chunks=%lld sampling=%s\n",
              (long long)n, (long long)o.new_tokens, (long long)chunks,
              o.sampling.greedy ? "greedy" : "sampled");
  std::printf("prefill_ms=%.3f (%lld tokens, %.0f tokens/s; median of %lld after %lld warm-up)\n",
              prefill_ms, (long long)n, double(n) / (prefill_ms / 1e3), (long long)o.repeats,
              (long long)o.warmup);
  if (first_prefill_ms >= 0) {
    std::printf("first_prefill_ms=%.3f (loads kernels, builds plans)\n", first_prefill_ms);
  }
  if (steps > 0) {
    std::printf("decode_ms_per_token=%.4f (execute only, %lld steps)\n",
                execute_ms / double(steps), (long long)steps);
    std::printf("tokens_per_s=%.1f (decode steps with logits to the host and sampling)\n",
                double(steps) / (decode_ms / 1e3));
  }
  std::printf("tokens: %s\n", join(out).c_str());
  if (!o.output.empty()) {
    std::ofstream f(o.output);
    f << join(out) << "\n";
    if (!f) fail("cannot write the tokens to '" + o.output + "'");
  }
  if (!o.logits_file.empty()) {
    std::ofstream f(o.logits_file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(all_logits.data()),
            std::streamsize(all_logits.size() * sizeof(float)));
    if (!f) fail("cannot write the logits to '" + o.logits_file + "'");
  }
  if (o.have_expect) {
    const bool same = out == o.expect;
    std::printf("matches expected tokens: %s\n", same ? "yes" : "no");
    if (!same) {
      size_t i = 0;
      while (i < out.size() && i < o.expect.size() && out[i] == o.expect[i]) ++i;
      std::printf("first difference at token %zu\n", i);
      return 1;
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace kiln::runner

int main(int argc, char** argv) { return kiln::runner::llm_main(argc, argv); }
