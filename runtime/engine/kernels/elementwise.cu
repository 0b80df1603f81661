// The elementwise families of elementwise.cuh: kBinary, kUnary, kWhere and kFusedElementwise.
// One file of about 550 lines, on purpose: the four steps share the host-side helpers at its top,
// and the fused step must stay the exact composition of the other three (the same device math of
// elementwise_math.cuh, the same rounding after each step, so its output is bit-identical to the
// unfused chain), which is checked most easily with all four side by side.
#include "runtime/engine/kernels/elementwise.cuh"

#include <cmath>
#include <limits>

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/elementwise_math.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::BinaryKind;
using blob::DType;
using blob::UnaryKind;
using executorch::runtime::Error;

bool unary_kind_is_exact_on_integers(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::kRelu:
    case UnaryKind::kNeg:
    case UnaryKind::kAbs:
    case UnaryKind::kClamp:
    case UnaryKind::kLogicalNot:
    case UnaryKind::kIdentity: return true;
    default: return false;
  }
}

// Host-side double -> int64 without undefined behaviour (NaN gives 0, out of range saturates).
int64_t saturate_to_int64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (v <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

// ---------------------------------------------------------------------------------------------
// Binary.

struct BinaryScalars {
  float alpha_f, scalar_f;
  int64_t alpha_i, scalar_i;
};

// a and b stored as T (b may be absent: the scalar), out as TOut (T, or Bool for comparisons).
// Operand 0 of the loop is out, 1 is a, 2 is b.
template <typename T, typename TOut, typename Index>
__global__ void binary_kernel(TOut* __restrict__ out, const T* __restrict__ a,
                              const T* __restrict__ b, const BinaryScalars s,
                              const StridedLoop<3> loop, BinaryKind kind) {
  const Index n = static_cast<Index>(loop.numel);
  for (Index i = static_cast<Index>(thread_index()); i < n;
       i += static_cast<Index>(thread_count())) {
    int64_t off[3];
    strided_offsets(loop, i, off);
    if constexpr (std::is_integral_v<T>) {
      const int64_t vb = b != nullptr ? to_int(b[off[2]]) : s.scalar_i;
      out[off[0]] = from_int<TOut>(binary_int(kind, to_int(a[off[1]]), vb, s.alpha_i));
    } else {
      const float vb = b != nullptr ? to_float(b[off[2]]) : s.scalar_f;
      out[off[0]] = from_float<TOut>(binary_float(kind, to_float(a[off[1]]), vb, s.alpha_f));
    }
  }
}

// Mixed dtypes, read and written through their runtime dtype.
template <bool kFloatMath>
__global__ void binary_dyn_kernel(void* __restrict__ out, DType out_dtype,
                                  const void* __restrict__ a, DType a_dtype,
                                  const void* __restrict__ b, DType b_dtype, const BinaryScalars s,
                                  const StridedLoop<3> loop, BinaryKind kind) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[3];
    strided_offsets(loop, i, off);
    if constexpr (kFloatMath) {
      const float va = static_cast<float>(load_f64(a, a_dtype, off[1]));
      const float vb = b != nullptr ? static_cast<float>(load_f64(b, b_dtype, off[2])) : s.scalar_f;
      store_f64(out, out_dtype, off[0], binary_float(kind, va, vb, s.alpha_f));
    } else {
      const int64_t va = load_i64(a, a_dtype, off[1]);
      const int64_t vb = b != nullptr ? load_i64(b, b_dtype, off[2]) : s.scalar_i;
      store_i64(out, out_dtype, off[0], binary_int(kind, va, vb, s.alpha_i));
    }
  }
}

enum class BMode : int { kDense = 0, kUniform = 1, kScalar = 2 };

// Contiguous a and out (and b, unless it is one value), all 16-byte aligned: 16-byte accesses.
template <typename T>
__global__ void binary_vec_kernel(T* __restrict__ out, const T* __restrict__ a,
                                  const T* __restrict__ b, BMode b_mode, float scalar, float alpha,
                                  BinaryKind kind, int64_t n) {
  constexpr int kWidth = 16 / sizeof(T);
  using P = Pack<T, kWidth>;
  const float uniform = b_mode == BMode::kUniform ? to_float(b[0]) : scalar;
  const int64_t packs = n / kWidth;
  for (int64_t i = thread_index(); i < packs; i += thread_count()) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    P pb = {};
    if (b_mode == BMode::kDense) {
      pb = reinterpret_cast<const P*>(b)[i];
    }
    P po;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const float vb = b_mode == BMode::kDense ? to_float(pb.v[j]) : uniform;
      po.v[j] = from_float<T>(binary_float(kind, to_float(pa.v[j]), vb, alpha));
    }
    reinterpret_cast<P*>(out)[i] = po;
  }
  for (int64_t i = packs * kWidth + thread_index(); i < n; i += thread_count()) {
    const float vb = b_mode == BMode::kDense ? to_float(b[i]) : uniform;
    out[i] = from_float<T>(binary_float(kind, to_float(a[i]), vb, alpha));
  }
}

bool is_compare_or_logical(BinaryKind k) {
  return k >= BinaryKind::kEq && k <= BinaryKind::kLogicalOr;
}

class BinaryStep final : public Step {
 public:
  BinaryStep(const BinaryArgs& args, const Graph& graph)
      : kind_(args.kind),
        a_(args.a),
        b_(args.b),
        out_(args.out),
        a_dtype_(graph.tensors[args.a].dtype),
        b_dtype_(args.b == kNoTensor ? a_dtype_ : graph.tensors[args.b].dtype),
        out_dtype_(graph.tensors[args.out].dtype) {
    int64_t out_strides[blob::kMaxRank];
    contiguous_strides(args.rank, args.sizes, out_strides);
    static const int64_t kZero[blob::kMaxRank] = {};
    const int64_t* strides[3] = {out_strides, args.a_strides,
                                 args.b == kNoTensor ? kZero : args.b_strides};
    loop_ = collapse<3>(args.rank, args.sizes, strides);
    scalars_ = {static_cast<float>(args.alpha), static_cast<float>(args.scalar),
                saturate_to_int64(args.alpha), saturate_to_int64(args.scalar)};
    const bool scalar_is_fractional =
        args.b == kNoTensor &&
        !(std::isfinite(args.scalar) && args.scalar == std::trunc(args.scalar));
    float_math_ = is_floating(a_dtype_) || (args.b != kNoTensor && is_floating(b_dtype_)) ||
                  scalar_is_fractional || kind_ == BinaryKind::kDiv ||
                  (!is_compare_or_logical(kind_) && is_floating(out_dtype_));
    typed_ = b_dtype_ == a_dtype_ && (out_dtype_ == a_dtype_ || out_dtype_ == DType::kBool) &&
             float_math_ == is_floating(a_dtype_);
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(out_);
    const void* a = ctx.ptr(a_);
    const void* b = b_ == kNoTensor ? nullptr : ctx.ptr(b_);
    const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
    if (!typed_) {
      if (float_math_) {
        binary_dyn_kernel<true><<<blocks, kBlock, 0, ctx.stream>>>(
            out, out_dtype_, a, a_dtype_, b, b_dtype_, scalars_, loop_, kind_);
      } else {
        binary_dyn_kernel<false><<<blocks, kBlock, 0, ctx.stream>>>(
            out, out_dtype_, a, a_dtype_, b, b_dtype_, scalars_, loop_, kind_);
      }
      return Error::Ok;
    }
    if (is_floating(a_dtype_) && out_dtype_ == a_dtype_ && try_vector(out, a, b, ctx)) {
      return Error::Ok;
    }
    const bool bool_out = out_dtype_ == DType::kBool && a_dtype_ != DType::kBool;
    visit_dtype(a_dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (bool_out) {
        launch<T, uint8_t>(out, a, b, blocks, ctx);
      } else {
        launch<T, T>(out, a, b, blocks, ctx);
      }
    });
    return Error::Ok;
  }

 private:
  template <typename T, typename TOut>
  void launch(void* out, const void* a, const void* b, unsigned blocks, const RunContext& ctx) {
    if (loop_.numel <= INT32_MAX) {
      binary_kernel<T, TOut, uint32_t>
          <<<blocks, kBlock, 0, ctx.stream>>>(static_cast<TOut*>(out), static_cast<const T*>(a),
                                              static_cast<const T*>(b), scalars_, loop_, kind_);
    } else {
      binary_kernel<T, TOut, int64_t>
          <<<blocks, kBlock, 0, ctx.stream>>>(static_cast<TOut*>(out), static_cast<const T*>(a),
                                              static_cast<const T*>(b), scalars_, loop_, kind_);
    }
  }

  bool try_vector(void* out, const void* a, const void* b, const RunContext& ctx) {
    if (!is_dense(loop_, 0) || !is_dense(loop_, 1)) {
      return false;
    }
    BMode mode = BMode::kScalar;
    if (b != nullptr) {
      if (is_dense(loop_, 2)) {
        mode = BMode::kDense;
      } else if (loop_.rank == 1 && loop_.strides[2][0] == 0) {
        mode = BMode::kUniform;
      } else {
        return false;
      }
    }
    if (alignment_of(out) < 16 || alignment_of(a) < 16 ||
        (mode == BMode::kDense && alignment_of(b) < 16)) {
      return false;
    }
    const unsigned blocks = blocks_for(loop_.numel / 4 + 1, kBlock, ctx.max_blocks);
    visit_floating(a_dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      binary_vec_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(
          static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), mode,
          scalars_.scalar_f, scalars_.alpha_f, kind_, loop_.numel);
    });
    return true;
  }

  BinaryKind kind_;
  int64_t a_, b_, out_;
  DType a_dtype_, b_dtype_, out_dtype_;
  StridedLoop<3> loop_;
  BinaryScalars scalars_{};
  bool float_math_ = true;
  bool typed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Unary.

// x and out both T (floating), contiguous; kWidth elements per access (1 when unaligned).
template <typename T, int kWidth>
__global__ void unary_vec_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n,
                                 UnaryKind kind, float p0, float p1) {
  using P = Pack<T, kWidth>;
  const int64_t packs = n / kWidth;
  for (int64_t i = thread_index(); i < packs; i += thread_count()) {
    const P px = reinterpret_cast<const P*>(x)[i];
    P po;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      po.v[j] = from_float<T>(unary_float(kind, to_float(px.v[j]), p0, p1));
    }
    reinterpret_cast<P*>(out)[i] = po;
  }
  for (int64_t i = packs * kWidth + thread_index(); i < n; i += thread_count()) {
    out[i] = from_float<T>(unary_float(kind, to_float(x[i]), p0, p1));
  }
}

template <bool kFloatMath>
__global__ void unary_dyn_kernel(void* __restrict__ out, DType out_dtype,
                                 const void* __restrict__ x, DType x_dtype, int64_t n,
                                 UnaryKind kind, float p0, float p1, int64_t lo, int64_t hi) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    if constexpr (kFloatMath) {
      const float v = static_cast<float>(load_f64(x, x_dtype, i));
      store_f64(out, out_dtype, i, unary_float(kind, v, p0, p1));
    } else {
      store_i64(out, out_dtype, i, unary_int(kind, load_i64(x, x_dtype, i), lo, hi));
    }
  }
}

class UnaryStep final : public Step {
 public:
  UnaryStep(const UnaryArgs& args, const Graph& graph)
      : kind_(args.kind),
        x_(args.x),
        out_(args.out),
        x_dtype_(graph.tensors[args.x].dtype),
        out_dtype_(graph.tensors[args.out].dtype),
        n_(graph.tensors[args.x].numel),
        p0_(static_cast<float>(args.p0)),
        p1_(static_cast<float>(args.p1)) {
    // clamp bounds on integers: the smallest integer >= p0 and the largest <= p1.
    lo_ = std::isnan(args.p0) ? std::numeric_limits<int64_t>::min()
                              : saturate_to_int64(std::ceil(args.p0));
    hi_ = std::isnan(args.p1) ? std::numeric_limits<int64_t>::max()
                              : saturate_to_int64(std::floor(args.p1));
    int_math_ = !is_floating(x_dtype_) && !is_floating(out_dtype_) &&
                unary_kind_is_exact_on_integers(kind_);
  }

  Error enqueue(const RunContext& ctx) override {
    if (n_ == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(out_);
    const void* x = ctx.ptr(x_);
    if (x_dtype_ == out_dtype_ && is_floating(x_dtype_)) {
      const bool aligned = alignment_of(out) >= 16 && alignment_of(x) >= 16;
      visit_floating(x_dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        constexpr int kWidth = 16 / sizeof(T);
        if (aligned) {
          const unsigned blocks = blocks_for(n_ / kWidth + 1, kBlock, ctx.max_blocks);
          unary_vec_kernel<T, kWidth><<<blocks, kBlock, 0, ctx.stream>>>(
              static_cast<T*>(out), static_cast<const T*>(x), n_, kind_, p0_, p1_);
        } else {
          const unsigned blocks = blocks_for(n_, kBlock, ctx.max_blocks);
          unary_vec_kernel<T, 1><<<blocks, kBlock, 0, ctx.stream>>>(
              static_cast<T*>(out), static_cast<const T*>(x), n_, kind_, p0_, p1_);
        }
      });
      return Error::Ok;
    }
    const unsigned blocks = blocks_for(n_, kBlock, ctx.max_blocks);
    if (int_math_) {
      unary_dyn_kernel<false><<<blocks, kBlock, 0, ctx.stream>>>(out, out_dtype_, x, x_dtype_, n_,
                                                                 kind_, p0_, p1_, lo_, hi_);
    } else {
      unary_dyn_kernel<true><<<blocks, kBlock, 0, ctx.stream>>>(out, out_dtype_, x, x_dtype_, n_,
                                                                kind_, p0_, p1_, lo_, hi_);
    }
    return Error::Ok;
  }

 private:
  UnaryKind kind_;
  int64_t x_, out_;
  DType x_dtype_, out_dtype_;
  int64_t n_;
  float p0_, p1_;
  int64_t lo_ = 0, hi_ = 0;
  bool int_math_ = false;
};

// ---------------------------------------------------------------------------------------------
// Where. Operand 0 of the loop is out, 1 cond, 2 a, 3 b.

template <typename Word>
__global__ void where_kernel(Word* __restrict__ out, const uint8_t* __restrict__ cond,
                             const Word* __restrict__ a, const Word* __restrict__ b,
                             const StridedLoop<4> loop) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[4];
    strided_offsets(loop, i, off);
    out[off[0]] = cond[off[1]] != 0 ? a[off[2]] : b[off[3]];
  }
}

__global__ void where_dyn_kernel(void* __restrict__ out, DType out_dtype,
                                 const uint8_t* __restrict__ cond, const void* __restrict__ a,
                                 DType a_dtype, const void* __restrict__ b, DType b_dtype,
                                 const StridedLoop<4> loop, bool integral) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[4];
    strided_offsets(loop, i, off);
    const bool take_a = cond[off[1]] != 0;
    if (integral) {
      store_i64(out, out_dtype, off[0],
                take_a ? load_i64(a, a_dtype, off[2]) : load_i64(b, b_dtype, off[3]));
    } else {
      store_f64(out, out_dtype, off[0],
                take_a ? load_f64(a, a_dtype, off[2]) : load_f64(b, b_dtype, off[3]));
    }
  }
}

class WhereStep final : public Step {
 public:
  WhereStep(const WhereArgs& args, const Graph& graph)
      : cond_(args.cond),
        a_(args.a),
        b_(args.b),
        out_(args.out),
        a_dtype_(graph.tensors[args.a].dtype),
        b_dtype_(graph.tensors[args.b].dtype),
        out_dtype_(graph.tensors[args.out].dtype) {
    int64_t out_strides[blob::kMaxRank];
    contiguous_strides(args.rank, args.sizes, out_strides);
    const int64_t* strides[4] = {out_strides, args.cond_strides, args.a_strides, args.b_strides};
    loop_ = collapse<4>(args.rank, args.sizes, strides);
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(out_);
    const auto* cond = ctx.ptr<const uint8_t>(cond_);
    const void* a = ctx.ptr(a_);
    const void* b = ctx.ptr(b_);
    const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
    if (a_dtype_ != out_dtype_ || b_dtype_ != out_dtype_) {
      const bool integral =
          !is_floating(a_dtype_) && !is_floating(b_dtype_) && !is_floating(out_dtype_);
      where_dyn_kernel<<<blocks, kBlock, 0, ctx.stream>>>(out, out_dtype_, cond, a, a_dtype_, b,
                                                          b_dtype_, loop_, integral);
      return Error::Ok;
    }
    switch (element_size(out_dtype_)) {
      case 1: return launch<uint8_t>(out, cond, a, b, blocks, ctx);
      case 2: return launch<uint16_t>(out, cond, a, b, blocks, ctx);
      case 4: return launch<uint32_t>(out, cond, a, b, blocks, ctx);
      default: return launch<uint64_t>(out, cond, a, b, blocks, ctx);
    }
  }

 private:
  template <typename Word>
  Error launch(void* out, const uint8_t* cond, const void* a, const void* b, unsigned blocks,
               const RunContext& ctx) {
    where_kernel<Word><<<blocks, kBlock, 0, ctx.stream>>>(static_cast<Word*>(out), cond,
                                                          static_cast<const Word*>(a),
                                                          static_cast<const Word*>(b), loop_);
    return Error::Ok;
  }

  int64_t cond_, a_, b_, out_;
  DType a_dtype_, b_dtype_, out_dtype_;
  StridedLoop<4> loop_;
};

// ---------------------------------------------------------------------------------------------
// Fused elementwise program. Loop operand 0 is out, 1 + i input i.

constexpr int kFusedOperands = 1 + blob::kMaxFusedInputs;
constexpr int kFusedRegisters = blob::kMaxFusedInputs + blob::kMaxFusedInstrs;

struct FusedInstrDev {
  int8_t form, src0, src1, src2;
  int32_t kind;
  float p0, p1;
  DType round;
};

struct FusedProgram {
  int32_t num_inputs, num_instrs;
  DType in_dtype[blob::kMaxFusedInputs];
  DType out_dtype;
  FusedInstrDev instrs[blob::kMaxFusedInstrs];
  const void* in[blob::kMaxFusedInputs];
};

// What storing into a tensor of `dt` and reading it back gives: the unfused op's rounding.
__device__ __forceinline__ float round_to(DType dt, float v) {
  switch (dt) {
    case DType::kFloat16: return __half2float(__float2half_rn(v));
    case DType::kBFloat16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
  }
}

// Runs the program over this thread's registers r[k * kBlock] (inputs 0..num_inputs - 1 loaded)
// and returns the last instruction's value.
__device__ __forceinline__ float run_program(const FusedInstrDev* instrs, int num_inputs,
                                             int num_instrs, float* r) {
  float v = 0.0f;
  for (int j = 0; j < num_instrs; ++j) {
    const FusedInstrDev in = instrs[j];
    if (in.form == static_cast<int8_t>(blob::FusedForm::kUnary)) {
      v = unary_float(static_cast<UnaryKind>(in.kind), r[in.src0 * kBlock], in.p0, in.p1);
    } else if (in.form == static_cast<int8_t>(blob::FusedForm::kBinary)) {
      const float b = in.src1 >= 0 ? r[in.src1 * kBlock] : in.p1;
      v = binary_float(static_cast<BinaryKind>(in.kind), r[in.src0 * kBlock], b, in.p0);
    } else {
      v = r[in.src0 * kBlock] != 0.0f ? r[in.src1 * kBlock] : r[in.src2 * kBlock];
    }
    v = round_to(in.round, v);
    r[(num_inputs + j) * kBlock] = v;
  }
  return v;
}

// Copies the program's instructions to shared memory with constant indices into the parameter.
__device__ __forceinline__ void stage_program(const FusedProgram& prog, FusedInstrDev* instrs) {
#pragma unroll
  for (int j = 0; j < static_cast<int>(blob::kMaxFusedInstrs); ++j) {
    if (static_cast<int>(threadIdx.x) == j) instrs[j] = prog.instrs[j];
  }
  __syncthreads();
}

// The program's instructions and the register file live in shared memory: a per-thread register
// array indexed by values known only at run time (each instruction's source registers) sat in
// local memory (a 208-byte stack frame); here a 1M-element SwiGLU took 20 us where it took 45.
// Every parameter read below has a constant index. regs[r][threadIdx.x]: consecutive threads in
// consecutive banks.
template <typename Index>
__global__ void __launch_bounds__(kBlock) fused_kernel(void* __restrict__ out,
                                                       const FusedProgram prog,
                                                       const StridedLoop<kFusedOperands> loop) {
  __shared__ FusedInstrDev instrs[blob::kMaxFusedInstrs];
  __shared__ float regs[kFusedRegisters][kBlock];
  stage_program(prog, instrs);   // from the kernel's parameters: before the wait
  wait_for_previous_kernel();    // launched overlapped (common.cuh)
  allow_next_kernel();
  float* r = &regs[0][threadIdx.x];  // register k of this thread: r[k * kBlock]
  const Index n = static_cast<Index>(loop.numel);
  for (Index i = static_cast<Index>(thread_index()); i < n;
       i += static_cast<Index>(thread_count())) {
    int64_t off[kFusedOperands];
    strided_offsets(loop, i, off);
#pragma unroll
    for (int k = 0; k < static_cast<int>(blob::kMaxFusedInputs); ++k) {
      if (k < prog.num_inputs) {
        r[k * kBlock] = static_cast<float>(load_f64(prog.in[k], prog.in_dtype[k], off[1 + k]));
      }
    }
    const float v = run_program(instrs, prog.num_inputs, prog.num_instrs, r);
    store_f64(out, prog.out_dtype, off[0], static_cast<double>(v));
  }
}

// The gated activation act(a) * b of a SwiGLU / GeGLU block (the one program every decoder
// layer runs), contiguous operands of one dtype: compiled for its activation, so its code is a
// few instructions where the interpreter's switches span the whole elementwise library (run
// once per graph replay amid other kernels, those miss the instruction cache: 20 us for 1M
// elements where this takes a few). Each step rounds to T as the interpreter does.
template <typename T, int kWidth, UnaryKind kAct>
__global__ void __launch_bounds__(kBlock) glu_kernel(T* __restrict__ out, const T* __restrict__ a,
                                                     const T* __restrict__ b, int64_t n) {
  using P = Pack<T, kWidth>;
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();
  for (int64_t i = thread_index(); i < n / kWidth; i += thread_count()) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    const P pb = reinterpret_cast<const P*>(b)[i];
    P o;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      const float act = to_float(from_float<T>(unary_float(kAct, to_float(pa.v[e]), 0.0f, 0.0f)));
      o.v[e] = from_float<T>(act * to_float(pb.v[e]));
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
  for (int64_t i = n / kWidth * kWidth + thread_index(); i < n; i += thread_count()) {
    const float act = to_float(from_float<T>(unary_float(kAct, to_float(a[i]), 0.0f, 0.0f)));
    out[i] = from_float<T>(act * to_float(b[i]));
  }
}

}  // namespace

bool glu_program(const FusedElementwiseArgs& args, DType dtype, int32_t* act_input,
                 UnaryKind* act) {
  if (args.num_inputs != 2 || args.num_instrs != 2) return false;
  const FusedInstr& u = args.instrs[0];
  const FusedInstr& m = args.instrs[1];
  if (u.form != blob::FusedForm::kUnary || u.round != dtype || m.form != blob::FusedForm::kBinary ||
      m.kind != int64_t(BinaryKind::kMul) || m.round != dtype || u.src[0] < 0 || u.src[0] > 1) {
    return false;
  }
  const int32_t other = 1 - u.src[0];
  if (!((m.src[0] == 2 && m.src[1] == other) || (m.src[0] == other && m.src[1] == 2))) {
    return false;
  }
  const UnaryKind kind = static_cast<UnaryKind>(u.kind);
  if (kind != UnaryKind::kSilu && kind != UnaryKind::kGeluErf && kind != UnaryKind::kGeluTanh &&
      kind != UnaryKind::kRelu && kind != UnaryKind::kSigmoid) {
    return false;
  }
  *act_input = u.src[0];
  *act = kind;
  return true;
}

namespace {

class FusedStep final : public Step {
 public:
  FusedStep(const FusedElementwiseArgs& args, const Graph& graph) : args_(args) {
    int64_t out_strides[blob::kMaxRank];
    contiguous_strides(args.rank, args.sizes, out_strides);
    static const int64_t kZero[blob::kMaxRank] = {};
    const int64_t* strides[kFusedOperands];
    strides[0] = out_strides;
    for (uint32_t k = 0; k < blob::kMaxFusedInputs; ++k) {
      strides[1 + k] = k < args.num_inputs ? args.strides[k] : kZero;
    }
    loop_ = collapse<kFusedOperands>(args.rank, args.sizes, strides);
    prog_.num_inputs = static_cast<int32_t>(args.num_inputs);
    prog_.num_instrs = static_cast<int32_t>(args.num_instrs);
    prog_.out_dtype = graph.tensors[args.out].dtype;
    for (uint32_t k = 0; k < args.num_inputs; ++k) {
      prog_.in_dtype[k] = graph.tensors[args.inputs[k]].dtype;
    }
    for (uint32_t j = 0; j < args.num_instrs; ++j) {
      const FusedInstr& in = args.instrs[j];
      prog_.instrs[j] = {static_cast<int8_t>(in.form), static_cast<int8_t>(in.src[0]),
                         static_cast<int8_t>(in.src[1]), static_cast<int8_t>(in.src[2]),
                         static_cast<int32_t>(in.kind), static_cast<float>(in.p0),
                         static_cast<float>(in.p1), in.round};
    }
    match_glu(args);
  }

  // act(r_a) * r_b over contiguous operands of one floating dtype, each step rounded to it:
  // [unary act of input a][binary mul of r2 and the other input], with no scalar factor.
  void match_glu(const FusedElementwiseArgs& args) {
    if (args.num_inputs != 2 || args.num_instrs != 2) return;
    if (!is_floating(prog_.out_dtype) || loop_.rank > 1) return;
    for (uint32_t k = 0; k < 2; ++k) {
      if (prog_.in_dtype[k] != prog_.out_dtype) return;
      if (loop_.rank == 1 && loop_.strides[1 + k][0] != 1) return;
    }
    glu_ = glu_program(args, prog_.out_dtype, &glu_act_input_, &glu_kind_);
  }

  template <typename T, int kWidth>
  void launch_glu(T* out, const T* a, const T* b, const RunContext& ctx) const {
    const unsigned blocks = blocks_for(loop_.numel / kWidth + 1, kBlock, ctx.max_blocks);
    const int64_t n = loop_.numel;
    switch (glu_kind_) {
      case UnaryKind::kSilu:
        launch_overlapped(glu_kernel<T, kWidth, UnaryKind::kSilu>, blocks, kBlock, 0, ctx.stream, out, a, b, n);
        break;
      case UnaryKind::kGeluErf:
        launch_overlapped(glu_kernel<T, kWidth, UnaryKind::kGeluErf>, blocks, kBlock, 0, ctx.stream, out, a, b, n);
        break;
      case UnaryKind::kGeluTanh:
        launch_overlapped(glu_kernel<T, kWidth, UnaryKind::kGeluTanh>, blocks, kBlock, 0, ctx.stream, out, a, b, n);
        break;
      case UnaryKind::kRelu:
        launch_overlapped(glu_kernel<T, kWidth, UnaryKind::kRelu>, blocks, kBlock, 0, ctx.stream, out, a, b, n);
        break;
      default:
        launch_overlapped(glu_kernel<T, kWidth, UnaryKind::kSigmoid>, blocks, kBlock, 0, ctx.stream, out, a, b, n);
        break;
    }
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    FusedProgram prog = prog_;
    for (uint32_t k = 0; k < args_.num_inputs; ++k) {
      prog.in[k] = ctx.ptr(args_.inputs[k]);
    }
    void* out = ctx.ptr(args_.out);
    if (glu_) {
      const bool aligned = alignment_of(out) >= 16 && alignment_of(prog.in[0]) >= 16 &&
                           alignment_of(prog.in[1]) >= 16;
      visit_floating(prog_.out_dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* a = static_cast<const T*>(prog.in[glu_act_input_]);
        const T* b = static_cast<const T*>(prog.in[1 - glu_act_input_]);
        if (aligned) {
          launch_glu<T, 16 / sizeof(T)>(static_cast<T*>(out), a, b, ctx);
        } else {
          launch_glu<T, 1>(static_cast<T*>(out), a, b, ctx);
        }
      });
      return Error::Ok;
    }
    const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
    if (loop_.numel <= INT32_MAX) {
      launch_overlapped(fused_kernel<uint32_t>, blocks, kBlock, 0, ctx.stream, out, prog, loop_);
    } else {
      launch_overlapped(fused_kernel<int64_t>, blocks, kBlock, 0, ctx.stream, out, prog, loop_);
    }
    return Error::Ok;
  }

 private:
  FusedElementwiseArgs args_;
  FusedProgram prog_{};
  StridedLoop<kFusedOperands> loop_;
  bool glu_ = false;  // the program is act(input a) * input b (glu_kernel)
  UnaryKind glu_kind_ = UnaryKind::kSilu;
  int32_t glu_act_input_ = 0;
};

}  // namespace

StepResult make_fused_elementwise_step(const FusedElementwiseArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new FusedStep(args, ctx.graph));
}

StepResult make_binary_step(const BinaryArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new BinaryStep(args, ctx.graph));
}

StepResult make_unary_step(const UnaryArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new UnaryStep(args, ctx.graph));
}

StepResult make_where_step(const WhereArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new WhereStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
