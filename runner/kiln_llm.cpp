// kiln_llm: token generation with a program kiln_executorch.llm.export_llm wrote (methods prefill
// and decode sharing the KV cache in Kiln's GPU state, each returning the logits and their argmax;
// constant methods max_context, prefill_length and vocab_size). Token ids in, token ids out; no
// tokenizer.
//
//   kiln_llm model.pte (--prompt "1 72 105" | --prompt-file FILE) [--new-tokens N]
//            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--output FILE]
//            [--expect "ids"] [--force "ids"] [--logits FILE] [--warmup N] [--repeats R]
//            [--quiet]
//
// The prompt runs through prefill in chunks of prefill_length tokens (the last one padded), then
// decode runs once per new token. Greedy (the methods' own argmax, on the GPU) unless
// --temperature, --top-k or --top-p is given (then a draw from the logits, seeded by --seed).
// A device-resident program (export_llm(..., device_resident=True)) keeps every input and output
// on the GPU: a greedy step's token goes to the next step without visiting the host
// (llm_session.h). Prints the prefill time, decode ms per token (the step: its inputs in, execute,
// its outputs out) and tokens/s (whole steps, sampling included), a progress line on stderr, and
// the tokens. Before the timed run, --warmup (default 2) untimed prefills of the prompt and
// decode steps run: a delegate's first execute loads its kernels and builds its library plans,
// its second captures the CUDA graph it replays from then on (the first prefill's time is printed
// too). They write the cache rows the timed run writes again, so the tokens do not change.
// --repeats R times the prompt's prefill R times and prints the median. --force feeds the given
// tokens to decode instead of the sampled ones (teacher forcing: compare logits step by step with
// another model's run of the same tokens) and --logits writes every step's float32 logits to
// FILE, one row per step; --output writes the tokens to a file, --expect compares them (exit 1
// when they differ). A prompt that does not fit the cache, a token id outside the vocabulary or
// a bad option is an error before anything runs. Program loading is kiln_runner's
// (program_loader.h).

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
#include "runner/llm_session.h"
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
  LlmSession session(program, o.model, chunk, vocab, max_context);
  std::printf("model %s: max_context=%lld prefill_length=%lld vocab=%lld load_ms prefill=%.1f "
              "decode=%.1f io=%s\n", o.model.c_str(), (long long)max_context, (long long)chunk,
              (long long)vocab, session.load_ms(true), session.load_ms(false),
              session.device_resident() ? "device" : "host");

  std::vector<int64_t> tokens(static_cast<size_t>(chunk)), positions(static_cast<size_t>(chunk));
  Sampler sampler(o.sampling);
  // Logits are needed on the host only to sample or to write them out; greedy steps use the
  // methods' own argmax.
  const bool host_logits = !o.sampling.greedy || !o.logits_file.empty();
  // One prefill of the whole prompt, chunk by chunk.
  const int64_t chunks = (n + chunk - 1) / chunk;
  auto prefill_prompt = [&]() {
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t real = std::min(chunk, n - start);
      for (int64_t i = 0; i < chunk; ++i) {
        tokens[size_t(i)] = i < real ? o.prompt[size_t(start + i)] : 0;  // pad: any id
        positions[size_t(i)] = start + i;
      }
      session.prefill(tokens, positions, real - 1,
                      "prefill of prompt rows " + std::to_string(start) + ".." +
                          std::to_string(start + real - 1));
    }
  };
  // The token the last step chose: the methods' argmax, or a draw from its logits.
  std::vector<float> all_logits;   // --logits: one row per step
  auto choose = [&]() -> int64_t {
    if (!host_logits) return session.token();
    const float* l = session.logits();
    if (!o.logits_file.empty()) all_logits.insert(all_logits.end(), l, l + vocab);
    return o.sampling.greedy ? session.token() : sampler.next(l, size_t(vocab));
  };
  // Warm-up: the decode steps write row n, which the first timed decode step writes again
  // before anything reads it.
  double first_prefill_ms = -1;
  for (int64_t w = 0; w < o.warmup; ++w) {
    const auto t0 = Clock::now();
    prefill_prompt();
    session.token();
    if (w == 0) first_prefill_ms = ms_since(t0);
    if (o.new_tokens > 1) {
      session.decode(0, n, "warm-up decode at position " + std::to_string(n));
      session.token();
    }
  }
  std::vector<double> prefill_times;
  for (int64_t r = 0; r < o.repeats; ++r) {
    const auto t0 = Clock::now();
    prefill_prompt();
    session.token();   // the prefill is done when its token is known
    prefill_times.push_back(ms_since(t0));
  }
  std::vector<int64_t> out{choose()};
  std::sort(prefill_times.begin(), prefill_times.end());
  const double prefill_ms = prefill_times[prefill_times.size() / 2];

  // Greedy generation without --force or --logits chains the steps on the device (a
  // device-resident program never returns a token to the host until the end); otherwise each
  // step's token comes from the host.
  const bool chained = o.sampling.greedy && o.force.empty() && o.logits_file.empty();
  double execute_ms = 0;
  const auto decode_start = Clock::now();
  for (int64_t step = 1; step < o.new_tokens; ++step) {
    const int64_t position = n + step - 1;
    const std::string what = "decode at position " + std::to_string(position);
    const auto t0 = Clock::now();
    if (chained) {
      session.decode_greedy(position, what);
    } else {
      session.decode(o.force.empty() ? out.back() : o.force[size_t(step - 1)], position, what);
      out.push_back(choose());
    }
    execute_ms += ms_since(t0);
    if (!o.quiet && (step % 16 == 0 || step + 1 == o.new_tokens)) {
      std::fprintf(stderr, "\rkiln_llm: %lld/%lld tokens, %.3f ms/token", (long long)(step + 1),
                   (long long)o.new_tokens, execute_ms / double(step));
    }
  }
  if (chained && o.new_tokens > 1) {
    // Each step was fed the one before's token: those, then the last step's own.
    out = session.greedy_tokens();
    out.push_back(session.token());
    execute_ms = ms_since(decode_start);
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
    std::printf("decode_ms_per_token=%.4f (%s, %lld steps)\n", execute_ms / double(steps),
                chained ? "greedy steps chained on the device"
                        : "execute, inputs in, logits out, sampling",
                (long long)steps);
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
