// Greedy decoding with the model export_tiny_lm.py writes: one `forward(token, input_pos)` call
// per token through ExecuTorch's Module API; the KV caches stay in the Kiln delegate's GPU state
// between calls, so each call moves only the token and position in and the logits out. The next
// token is the argmax of the logits, taken here on the host.
//
//   tiny_lm model.pte --prompt "1 72 105 33" --new-tokens N [--expect "1 72 ..."]
//
// Prints the tokens, the decode rate (tokens/s over the calls after the prompt, each a full
// host round trip: inputs in, logits out, argmax) and, with --expect, whether the tokens equal the
// expected ones (exit code 1 when they do not).

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

using executorch::extension::make_tensor_ptr;
using executorch::extension::Module;
namespace et = executorch::runtime;

namespace {

std::vector<int64_t> parse_tokens(const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  for (int64_t t; in >> t;) out.push_back(t);
  return out;
}

std::string join(const std::vector<int64_t>& tokens) {
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + std::to_string(tokens[i]);
  return s;
}

// One decode step: logits for `token` at `pos`, argmax on the host. Returns -1 on failure.
int64_t step(Module& module, int64_t token, int64_t pos) {
  auto tok = make_tensor_ptr({1, 1}, std::vector<int64_t>{token});
  auto at = make_tensor_ptr({1}, std::vector<int64_t>{pos});
  auto out = module.forward({et::EValue(*tok), et::EValue(*at)});
  if (!out.ok()) {
    std::fprintf(stderr, "tiny_lm: forward at position %lld failed: error 0x%x\n",
                 static_cast<long long>(pos), static_cast<unsigned>(out.error()));
    return -1;
  }
  const auto& logits = out->at(0).toTensor();
  const float* v = logits.const_data_ptr<float>();
  int64_t best = 0;
  for (ssize_t i = 1; i < logits.numel(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tiny_lm model.pte --prompt \"1 2 3\" --new-tokens N "
                         "[--expect \"...\"]\n");
    return 2;
  }
  std::vector<int64_t> prompt{1};
  std::vector<int64_t> expect;
  int new_tokens = 32;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--prompt") prompt = parse_tokens(argv[i + 1]);
    else if (arg == "--new-tokens") new_tokens = std::atoi(argv[i + 1]);
    else if (arg == "--expect") expect = parse_tokens(argv[i + 1]);
    else {
      std::fprintf(stderr, "tiny_lm: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (prompt.empty() || new_tokens < 1) {
    std::fprintf(stderr, "tiny_lm: need a non-empty --prompt and --new-tokens >= 1\n");
    return 2;
  }

  Module module(argv[1]);
  if (module.load_method("forward") != et::Error::Ok) {
    std::fprintf(stderr, "tiny_lm: cannot load 'forward' from %s\n", argv[1]);
    return 1;
  }
  std::vector<int64_t> tokens = prompt;
  int64_t pos = 0;
  // Prefill: the prompt one token at a time (only the last call's argmax is used).
  int64_t next = -1;
  for (; pos < static_cast<int64_t>(prompt.size()); ++pos) {
    next = step(module, tokens[pos], pos);
    if (next < 0) return 1;
  }
  tokens.push_back(next);
  const auto t0 = std::chrono::steady_clock::now();
  for (int n = 1; n < new_tokens; ++n, ++pos) {
    next = step(module, tokens[pos], pos);
    if (next < 0) return 1;
    tokens.push_back(next);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("tokens: %s\n", join(tokens).c_str());
  std::printf("decode: %d tokens in %.3f ms, %.1f tokens/s\n", new_tokens - 1, s * 1e3,
              s > 0 ? (new_tokens - 1) / s : 0.0);
  if (!expect.empty()) {
    const bool same = expect == tokens;
    std::printf("matches eager greedy tokens: %s\n", same ? "yes" : "no");
    if (!same) {
      std::printf("expected: %s\n", join(expect).c_str());
      return 1;
    }
  }
  return 0;
}
