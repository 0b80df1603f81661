#include "runner/options.h"

#include <cerrno>
#include <cstdlib>

namespace kiln::runner {
namespace {

bool parse_int(const std::string& s, long long min, long long& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < min) return false;
  out = v;
  return true;
}

// "I=rest" -> index I and rest.
bool split_indexed(const std::string& arg, size_t& index, std::string& rest) {
  const size_t eq = arg.find('=');
  long long i = 0;
  if (eq == std::string::npos || !parse_int(arg.substr(0, eq), 0, i)) return false;
  index = static_cast<size_t>(i);
  rest = arg.substr(eq + 1);
  return !rest.empty();
}

}  // namespace

bool parse_options(int argc, const char* const* argv, Options& out, std::string& error) {
  out = Options{};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string& v) {
      if (i + 1 >= argc) {
        error = arg + " needs a value";
        return false;
      }
      v = argv[++i];
      return true;
    };
    std::string v;
    long long n = 0;
    if (arg == "--method") {
      if (!value(out.method)) return false;
    } else if (arg == "--input") {
      size_t index = 0;
      std::string path;
      if (!value(v) || !split_indexed(v, index, path)) {
        if (error.empty()) error = "--input takes I=path.bin, got '" + v + "'";
        return false;
      }
      out.runs.back().input_files[index] = path;
    } else if (arg == "--shape") {
      size_t index = 0;
      std::string dims;
      if (!value(v) || !split_indexed(v, index, dims)) {
        if (error.empty()) error = "--shape takes I=d0,d1,..., got '" + v + "'";
        return false;
      }
      std::vector<int64_t> shape;
      size_t start = 0;
      while (start <= dims.size()) {
        const size_t comma = dims.find(',', start);
        const std::string d = dims.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!parse_int(d, 0, n)) {
          error = "--shape " + v + ": '" + d + "' is not a dimension";
          return false;
        }
        shape.push_back(n);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      out.shapes[index] = shape;
    } else if (arg == "--next") {
      out.runs.emplace_back();
    } else if (arg == "--iterations" || arg == "--warmup" || arg == "--values" ||
               arg == "--device-timing") {
      const bool positive = arg == "--iterations" || arg == "--device-timing";
      if (!value(v) || !parse_int(v, positive ? 1 : 0, n) || n > 100000000) {
        if (error.empty()) {
          error = arg + " takes a " + (positive ? "positive" : "non-negative") + " integer, got '" + v + "'";
        }
        return false;
      }
      if (arg == "--iterations") out.iterations = static_cast<int>(n);
      else if (arg == "--warmup") out.warmup = static_cast<int>(n);
      else if (arg == "--device-timing") out.device_timing = static_cast<int>(n);
      else out.values = static_cast<size_t>(n);
    } else if (arg == "--copy-stats") {
      out.copy_stats = true;
    } else if (arg == "--profile") {
      out.profile = true;
    } else if (arg == "--profiler-range") {
      out.profiler_range = true;
    } else if (arg == "--output-dir") {
      if (!value(out.output_dir)) return false;
    } else if (!arg.empty() && arg[0] == '-') {
      error = "unknown option '" + arg + "'";
      return false;
    } else if (out.model.empty()) {
      out.model = arg;
    } else {
      error = "unexpected argument '" + arg + "' (the model is '" + out.model + "')";
      return false;
    }
  }
  if (out.model.empty()) {
    error = "no model given";
    return false;
  }
  return true;
}

}  // namespace kiln::runner
