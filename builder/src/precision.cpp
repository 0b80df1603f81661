// Precision conversion (fp16 / bf16) and the float rounding it needs.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <unordered_map>
#include <unordered_set>

#include "builder/src/passes.h"
#include "kiln/builder.h"

namespace kiln::builder {

uint16_t float_to_bfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  // torch's vectorised CPU conversion writes every NaN as 0xFFFF (not the scalar path's 0x7FC0);
  // Tensor.to() takes that path for every length, so match it.
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffff;
  uint32_t bias = ((bits >> 16) & 1u) + 0x7fffu;
  return uint16_t((bits + bias) >> 16);
}

uint16_t float_to_half(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  // NaN as the F16C instruction torch's conversion uses: quiet, top payload bits kept.
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // rounds to or past inf
  int32_t exponent = int32_t(abs >> 23) - 127;
  uint32_t mantissa = abs & 0x7fffffu;
  if (exponent >= -14) {
    // Normal half: 10 mantissa bits, round to nearest even on the 13 dropped ones (a carry
    // into the exponent is the correct result).
    uint32_t h = (uint32_t(exponent + 15) << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  if (exponent < -25) return sign;   // below half the smallest subnormal: +-0
  // Subnormal half: value = m * 2^-24 with the implicit bit made explicit.
  uint32_t full = mantissa | 0x800000u;
  int shift = -exponent - 14 + 13;   // 14..24 bits dropped
  uint32_t h = full >> shift;
  uint32_t rest = full & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

namespace {

const char* dtype_suffix(blob::DType dtype) {
  return dtype == blob::DType::kFloat16 ? "float16" : "bfloat16";
}

void convert_data(Tensor& t, blob::DType low) {
  size_t n = t.data.size() / 4;
  std::vector<uint8_t> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, t.data.data() + i * 4, 4);
    uint16_t h = low == blob::DType::kFloat16 ? float_to_half(f) : float_to_bfloat16(f);
    std::memcpy(out.data() + i * 2, &h, 2);
  }
  t.data = std::move(out);
}

bool is_elementwise(blob::Opcode op) {
  return op == blob::Opcode::kUnary || op == blob::Opcode::kBinary || op == blob::Opcode::kWhere;
}

// Unary kinds computed and stored in float32 whatever the precision. torch.autocast keeps a list
// of ops it runs in float32 under fp16/bf16 ("CUDA ops that can autocast to float32",
// https://pytorch.org/docs/stable/amp.html); erfinv is on it because the low dtype loses its
// answer, not a few bits: its slope grows without bound towards +-1, and bf16 rounds tanh(x) to
// exactly 1 for |x| > ~3, where erfinv is inf. The list's other entries (exp, log, softmax, ...)
// already compute in float32 registers here and lose only the final rounding, so they stay low.
constexpr blob::UnaryKind kFloat32OnlyUnaryKinds[] = {blob::UnaryKind::kErfinv};

bool runs_in_float32(const Op& op) {
  return op.opcode == blob::Opcode::kUnary &&
         std::any_of(std::begin(kFloat32OnlyUnaryKinds), std::end(kFloat32OnlyUnaryKinds),
                     [&](blob::UnaryKind k) { return op.at("kind") == int64_t(k); });
}

// Ops whose kernels read and write each tensor in its own dtype (elementwise math runs in float32
// registers, kCopy converts). Every other op takes one floating dtype throughout (the engine's
// op_decoder.cpp refuses a mix).
bool mixes_dtypes(const Op& op) {
  return is_elementwise(op.opcode) || op.opcode == blob::Opcode::kCopy;
}

// Arena roots a float32-only op reads or writes that can stay float32: every op writing them
// mixes dtypes, so it can write its float32 result unrounded. An operand that a one-dtype op
// writes (a matmul, say) stays low and is read rounded, as autocast would have rounded it.
std::unordered_set<int64_t> float32_only_roots(const Graph& g) {
  std::unordered_set<int64_t> keep;
  for (const Op& op : g.ops) {
    if (!runs_in_float32(op)) continue;
    for (int64_t t : {op.at("x"), op.out()}) {
      int64_t root = g.root(t);
      const Tensor& r = g.tensors[size_t(root)];
      if (r.dtype != blob::DType::kFloat32 || r.storage != blob::Storage::kArena) continue;
      bool writers_mix = std::all_of(g.ops.begin(), g.ops.end(), [&](const Op& w) {
        return g.root(w.out()) != root || mixes_dtypes(w);
      });
      if (writers_mix) keep.insert(root);
    }
  }
  return keep;
}

// float32 arena roots computed from integer tensors and constants alone, through ops that mix
// dtypes (casts, elementwise math, the copies of a cat): a rotary embedding's position * inv_freq
// and its cos / sin, position-derived masks. They stay float32, and so do the float32 constants
// only such ops read: the model computes them in float32 on purpose (HF's rotary embedding casts
// the positions with .float() under autocast disabled), and bf16's 8 significant bits would
// round position 1001 to 1000 and inv_freq by up to 2^-9 of itself, turning angles at position
// 2000 radians off. A root any of whose writers reads a computed low-precision value (an
// activation) is not one of them: its inputs are already rounded, so float32 would buy nothing.
std::unordered_set<int64_t> integer_derived_roots(const Graph& g) {
  std::unordered_set<int64_t> keep;
  for (const Op& op : g.ops) {
    const int64_t root = g.root(op.out());
    const Tensor& r = g.tensors[size_t(root)];
    if (r.dtype == blob::DType::kFloat32 && r.storage == blob::Storage::kArena) keep.insert(root);
  }
  // A value qualifies when it is integer (or Bool), a constant, or a qualifying root.
  auto qualifies = [&](int64_t t) {
    const Tensor& x = g.tensors[size_t(t)];
    if (!is_floating(x.dtype)) return true;
    const int64_t root = g.root(t);
    const blob::Storage storage = g.tensors[size_t(root)].storage;
    return storage == blob::Storage::kWeight || keep.count(root) > 0;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (const Op& op : g.ops) {
      const int64_t root = g.root(op.out());
      if (!keep.count(root)) continue;
      const auto r = op.reads();
      // Some read must be an integer tensor or a kept root: constants alone are not the point.
      const bool from_integers = std::any_of(r.begin(), r.end(), [&](int64_t t) {
        return !is_floating(g.tensors[size_t(t)].dtype) || keep.count(g.root(t)) > 0;
      });
      if (!mixes_dtypes(op) || !from_integers || !std::all_of(r.begin(), r.end(), qualifies)) {
        keep.erase(root);
        changed = true;
      }
    }
  }
  // A kept value that only casts and one-dtype ops read (cos / sin tables read by a kRope or cast
  // to the model's dtype) need not be stored float32: its writer computes in float32 registers
  // and rounds once, as the cast after it would.
  std::vector<int64_t> rounded_once;
  for (int64_t root : keep) {
    const auto by = readers(g, root);
    const bool only_rounded = std::all_of(by.begin(), by.end(), [&](const Op* o) {
      return !mixes_dtypes(*o) || (o->opcode == blob::Opcode::kCopy && !keep.count(g.root(o->out())));
    });
    if (only_rounded) rounded_once.push_back(root);
  }
  for (int64_t root : rounded_once) keep.erase(root);
  // Float32 constants read only by ops writing kept roots keep their precision too.
  std::unordered_set<int64_t> constants;
  for (const Op& op : g.ops) {
    if (!keep.count(g.root(op.out()))) continue;
    for (int64_t t : op.reads()) {
      const int64_t root = g.root(t);
      const Tensor& c = g.tensors[size_t(root)];
      if (c.dtype != blob::DType::kFloat32 || c.storage != blob::Storage::kWeight) continue;
      const auto by = readers(g, root);
      if (std::all_of(by.begin(), by.end(),
                      [&](const Op* o) { return keep.count(g.root(o->out())) > 0; })) {
        constants.insert(root);
      }
    }
  }
  keep.insert(constants.begin(), constants.end());
  return keep;
}

// float32 outputs that one elementwise op writes and nothing else reads or views. They stay
// float32: the op writes its fp32 result directly instead of rounding it to the low dtype and
// casting back, which saves a copy and keeps results the rounding would change (tanh(x) rounds
// to exactly 1 in bf16, and a CPU erfinv after it would then give inf).
std::unordered_set<int64_t> full_precision_outputs(const Graph& g) {
  std::unordered_set<int64_t> keep;
  for (int64_t tid : g.outputs) {
    const Tensor& t = g.tensors[size_t(tid)];
    if (t.dtype != blob::DType::kFloat32 || t.storage != blob::Storage::kArena ||
        t.alias_of != kNoTensor) {
      continue;
    }
    std::vector<const Op*> writers;
    for (const Op& op : g.ops) {
      if (op.out() == tid) writers.push_back(&op);
    }
    bool viewed = std::any_of(g.tensors.begin(), g.tensors.end(),
                              [&](const Tensor& o) { return o.alias_of == tid; });
    if (writers.size() == 1 && is_elementwise(writers[0]->opcode) && !viewed &&
        readers(g, tid).empty() && std::count(g.outputs.begin(), g.outputs.end(), tid) == 1) {
      keep.insert(tid);
    }
  }
  return keep;
}

// kQuantMatmul's per-channel (or per-group) scales stay Float32 in every precision, as the
// format requires: a bf16 scale would move every dequantized weight of its row by up to 2^-9 of
// itself, on top of the quantization error, for bytes that are 1 / K of the weight's.
std::unordered_set<int64_t> quant_scales(const Graph& g) {
  std::unordered_set<int64_t> keep;
  for (const Op& op : g.ops) {
    if (op.opcode == blob::Opcode::kQuantMatmul) keep.insert(g.root(op.at("scales")));
  }
  return keep;
}

}  // namespace

void convert_precision(Graph& g) {
  blob::DType low;
  if (g.precision == blob::Precision::kFp16) {
    low = blob::DType::kFloat16;
  } else if (g.precision == blob::Precision::kBf16) {
    low = blob::DType::kBFloat16;
  } else {
    return;
  }
  auto float32_only = float32_only_roots(g);
  for (int64_t root : integer_derived_roots(g)) float32_only.insert(root);
  std::vector<Op> body = std::move(g.ops);
  g.ops.clear();
  for (int64_t tid : g.inputs) {
    if (g.tensors[size_t(tid)].dtype != blob::DType::kFloat32) continue;
    // A float32-only op reads the input itself; everything else reads the cast.
    auto reads_cast = [&](const Op& op) {
      const auto r = op.reads();
      return std::find(r.begin(), r.end(), tid) != r.end() &&
             !(runs_in_float32(op) && op.at("x") == tid);
    };
    bool viewed = std::any_of(g.tensors.begin(), g.tensors.end(), [&](const Tensor& o) {
      return o.alias_of != kNoTensor && g.root(o.id) == tid;
    });
    if (!viewed && std::none_of(body.begin(), body.end(), reads_cast)) continue;
    Tensor t = g.tensors[size_t(tid)];
    int64_t cast = g.add_tensor(low, t.shape, t.name + "_" + dtype_suffix(low));
    for (Tensor& other : g.tensors) {
      if (other.alias_of != kNoTensor && g.root(other.id) == tid) other.alias_of = cast;
    }
    for (Op& op : body) {
      if (reads_cast(op)) op.rename(tid, cast);
    }
    g.ops.push_back(flat_copy(g, tid, cast));
  }
  for (Op& op : body) g.ops.push_back(std::move(op));

  std::vector<blob::DType> declared;
  for (int64_t t : g.outputs) declared.push_back(g.tensors[size_t(t)].dtype);
  auto keep = full_precision_outputs(g);
  const auto scales = quant_scales(g);
  for (Tensor& t : g.tensors) {
    if (t.dtype == blob::DType::kFloat32 && t.storage != blob::Storage::kInput &&
        !keep.count(t.id) && !float32_only.count(g.root(t.id)) && !scales.count(g.root(t.id))) {
      t.dtype = low;
      if (t.has_data) convert_data(t, low);
    }
  }
  // Ops that take one dtype read a low-precision copy of a float32-only tensor, made just before
  // the first of them.
  std::unordered_map<int64_t, int64_t> low_copy;   // float32 tensor -> its copy in `low`
  std::vector<Op> ops;
  for (Op& op : g.ops) {
    if (!mixes_dtypes(op)) {
      for (int64_t t : op.reads()) {
        if (!float32_only.count(g.root(t))) continue;
        auto it = low_copy.find(t);
        if (it == low_copy.end()) {
          Tensor src = g.tensors[size_t(t)];
          int64_t copy = g.add_tensor(low, src.shape, src.name + "_" + dtype_suffix(low));
          ops.push_back(flat_copy(g, t, copy));
          it = low_copy.emplace(t, copy).first;
        }
        op.rename(t, it->second);
      }
    }
    ops.push_back(std::move(op));
  }
  g.ops = std::move(ops);
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    int64_t tid = g.outputs[i];
    if (g.tensors[size_t(tid)].dtype == declared[i]) continue;
    Tensor t = g.tensors[size_t(tid)];
    g.outputs[i] = g.add_tensor(declared[i], t.shape, t.name);
    g.ops.push_back(flat_copy(g, tid, g.outputs[i]));
  }
}

}  // namespace kiln::builder
