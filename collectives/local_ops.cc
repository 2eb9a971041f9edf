#include "collectives/local_ops.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <utility>

#include "collectives/grad_ops.h"
#include "collectives/ir/op_registry.h"
#include "collectives/kernel_support.h"
#include "collectives/nn_ops.h"

namespace shardsim {
namespace {

using kernel::AnyShapeOnly;
using kernel::Fail;
using kernel::NormalizeAxis;

// Row-major strides (in elements) of a shape.
std::vector<int64_t> RowMajorStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

// Product of shape[begin, end).
int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

// Drops size-1 dimensions and merges neighbors that are contiguous in every stride set, so
// loops over the result run as few, long inner loops as possible.
void Coalesce(Shape& shape, std::initializer_list<std::vector<int64_t>*> sets) {
  Shape merged;
  std::vector<std::vector<int64_t>> out(sets.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !merged.empty();
    size_t k = 0;
    for (const std::vector<int64_t>* st : sets) {
      if (merge && out[k].back() != (*st)[d] * shape[d]) merge = false;
      ++k;
    }
    k = 0;
    if (merge) {
      merged.back() *= shape[d];
      for (const std::vector<int64_t>* st : sets) out[k++].back() = (*st)[d];
    } else {
      merged.push_back(shape[d]);
      for (const std::vector<int64_t>* st : sets) out[k++].push_back((*st)[d]);
    }
  }
  shape = std::move(merged);
  size_t k = 0;
  for (std::vector<int64_t>* st : sets) *st = std::move(out[k++]);
}

// Calls fn(offsets) for every index over the first `outer_rank` dimensions of `shape`, in
// row-major order, where offsets[k] = sum over d of index[d] * strides[k][d].
template <size_t N, typename Fn>
void ForEachOuter(const Shape& shape, int outer_rank,
                  const std::array<const std::vector<int64_t>*, N>& strides, Fn fn) {
  int64_t count = Product(shape, 0, static_cast<size_t>(outer_rank));
  std::vector<int64_t> index(static_cast<size_t>(outer_rank), 0);
  std::array<int64_t, N> off{};
  for (int64_t c = 0; c < count; ++c) {
    fn(off);
    for (int d = outer_rank - 1; d >= 0; --d) {
      ++index[d];
      for (size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * shape[d];
      index[d] = 0;
    }
  }
}

// Copies the elements of `src` seen through `strides` over `shape` into contiguous `dst`
// (row-major). Serves transposes and permutations; the last two dimensions are copied in
// tiles so strided reads stay in cache.
void StridedCopy(const float* src, Shape shape, std::vector<int64_t> strides, float* dst) {
  if (NumElements(shape) == 0) return;
  Coalesce(shape, {&strides});
  int r = static_cast<int>(shape.size());
  if (r == 0) {
    dst[0] = src[0];
    return;
  }
  if (strides[r - 1] == 1) {
    int64_t len = shape[r - 1];
    ForEachOuter<1>(shape, r - 1, {&strides}, [&](const std::array<int64_t, 1>& off) {
      std::memcpy(dst, src + off[0], static_cast<size_t>(len) * sizeof(float));
      dst += len;
    });
    return;
  }
  if (r == 1) {
    for (int64_t j = 0; j < shape[0]; ++j) dst[j] = src[j * strides[0]];
    return;
  }
  constexpr int64_t kTile = 32;
  int64_t rows = shape[r - 2], cols = shape[r - 1];
  int64_t s0 = strides[r - 2], s1 = strides[r - 1];
  ForEachOuter<1>(shape, r - 2, {&strides}, [&](const std::array<int64_t, 1>& off) {
    const float* base = src + off[0];
    for (int64_t ib = 0; ib < rows; ib += kTile) {
      int64_t ie = std::min(rows, ib + kTile);
      for (int64_t jb = 0; jb < cols; jb += kTile) {
        int64_t je = std::min(cols, jb + kTile);
        for (int64_t i = ib; i < ie; ++i) {
          const float* row = base + i * s0;
          float* out = dst + i * cols;
          for (int64_t j = jb; j < je; ++j) out[j] = row[j * s1];
        }
      }
    }
    dst += rows * cols;
  });
}

// Copies `data` (row-major over `shape`) into `dst` with its dimensions reordered so that
// output dimension i is input dimension perm[i].
void Permute(const float* data, const Shape& shape, const std::vector<int>& perm, float* dst) {
  std::vector<int64_t> in_strides = RowMajorStrides(shape);
  Shape out_shape(perm.size());
  std::vector<int64_t> strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    out_shape[i] = shape[perm[i]];
    strides[i] = in_strides[perm[i]];
  }
  StridedCopy(data, std::move(out_shape), std::move(strides), dst);
}

// NumPy's broadcast of two shapes, or nullopt.
std::optional<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Strides of an array of `shape` read as the broadcast `out` shape (0 where broadcast).
std::vector<int64_t> BroadcastStrides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> own = RowMajorStrides(shape);
  std::vector<int64_t> strides(out.size(), 0);
  size_t lead = out.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) strides[lead + d] = shape[d] == 1 ? 0 : own[d];
  return strides;
}

// C[m,n] = op(A) op(B) with float32 accumulation; skips empty products (C stays as is).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) return;
  // One BLAS thread: results then do not depend on the machine's core count, and OpenBLAS's
  // idle workers do not spin beside the simulation (devices' matmuls are small and many).
  static const bool kSingleThreaded = (openblas_set_num_threads(1), true);
  (void)kSingleThreaded;
  assert(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f,
              c, static_cast<int>(ldc));
}

// C[m,n] = op(A) op(B) for i32 words, accumulating in uint32 so sums and products wrap
// modulo 2^32 like XLA's int32 dot (exact, unlike sgemm above 2^24). Naive loops: integer
// matmuls are rare and small.
void IntGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
             int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      uint32_t acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        float x = trans_a ? a[p * lda + i] : a[i * lda + p];
        float y = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += static_cast<uint32_t>(WordToInt(x)) * static_cast<uint32_t>(WordToInt(y));
      }
      c[i * ldc + j] = IntToWord(static_cast<int32_t>(acc));
    }
  }
}

// Gemm or IntGemm, by the operands' dtype.
void AnyGemm(bool ints, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
             int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (ints) return IntGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  Gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

// `a` converted to `dtype` by value (JAX's promotion before an op): i32 -> float rounds the
// integer to the dtype, float -> i32 takes the nearest integer, float -> float rounds.
Array ConvertTo(const Array& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  if (!a.has_data()) return Array::ShapeOnly(dtype, a.shape());
  std::vector<float> words(static_cast<size_t>(a.size()));
  const float* x = a.data();
  if (dtype == DType::kI32) {
    for (int64_t i = 0; i < a.size(); ++i) words[i] = IntToWord(DoubleToInt32(x[i]));
  } else if (a.dtype() == DType::kI32) {
    for (int64_t i = 0; i < a.size(); ++i) words[i] = static_cast<float>(WordToInt(x[i]));
  } else {
    std::copy(x, x + a.size(), words.begin());
  }
  return Array::FromValues(dtype, a.shape(), std::move(words));
}

// `a` itself if it has `dtype`, else its conversion, kept alive in `holder`.
const Array& AsDType(const Array& a, DType dtype, Array& holder) {
  if (a.dtype() == dtype) return a;
  holder = ConvertTo(a, dtype);
  return holder;
}

// Integer arithmetic on i32 words, wrapping modulo 2^32 (two's complement, as XLA): done in
// uint32, where overflow is defined.
inline float WrapInt(uint32_t v) { return IntToWord(static_cast<int32_t>(v)); }
inline uint32_t UInt(float w) { return static_cast<uint32_t>(WordToInt(w)); }
struct IntAddFn {
  float operator()(float x, float y) const { return WrapInt(UInt(x) + UInt(y)); }
};
struct IntSubFn {
  float operator()(float x, float y) const { return WrapInt(UInt(x) - UInt(y)); }
};
struct IntMulFn {
  float operator()(float x, float y) const { return WrapInt(UInt(x) * UInt(y)); }
};
struct IntMaxFn {
  float operator()(float x, float y) const {
    return IntToWord(std::max(WordToInt(x), WordToInt(y)));
  }
};
struct IntReluFn {
  float operator()(float x) const { return IntToWord(std::max(WordToInt(x), 0)); }
};
struct IntNegFn {
  float operator()(float x) const { return WrapInt(0u - UInt(x)); }
};

// Elementwise functors: one inlined call per element, chosen once per op.
struct AddFn {
  float operator()(float x, float y) const { return x + y; }
};
struct SubFn {
  float operator()(float x, float y) const { return x - y; }
};
struct MulFn {
  float operator()(float x, float y) const { return x * y; }
};
struct DivFn {
  float operator()(float x, float y) const { return x / y; }
};
struct MaxFn {  // NaN propagates, as jnp.maximum.
  float operator()(float x, float y) const { return (x > y || std::isnan(x)) ? x : y; }
};
struct ReluFn {
  float operator()(float x) const { return std::max(x, 0.0f); }  // NaN stays NaN.
};
// jax.nn.gelu(x, approximate=True) = 0.5x(1 + tanh(z)), z = sqrt(2/pi)(x + 0.044715x^3),
// evaluated as x / (1 + exp(-2z)) (the same function): no cancellation in 1 + tanh(z) for
// negative x (relative error ~1e-6 against float64, where the tanh form loses digits), and
// expf is ~3x faster than tanhf.
struct GeluFn {
  float operator()(float x) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return x / (1.0f + std::exp(-2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  }
};
struct ExpFn {
  float operator()(float x) const { return std::exp(x); }
};
struct TanhFn {
  float operator()(float x) const { return std::tanh(x); }
};
struct NegFn {
  float operator()(float x) const { return -x; }
};
// jax.nn.silu(x) = x * sigmoid(x) = x / (1 + exp(-x)).
struct SiluFn {
  float operator()(float x) const { return x / (1.0f + std::exp(-x)); }
};
struct LogFn {
  float operator()(float x) const { return std::log(x); }
};
struct SqrtFn {
  float operator()(float x) const { return std::sqrt(x); }
};
struct RsqrtFn {
  float operator()(float x) const { return 1.0f / std::sqrt(x); }
};
struct SquareFn {
  float operator()(float x) const { return x * x; }
};
struct AbsFn {
  float operator()(float x) const { return std::fabs(x); }
};
struct SinFn {
  float operator()(float x) const { return std::sin(x); }
};
struct CosFn {
  float operator()(float x) const { return std::cos(x); }
};
struct IntSquareFn {
  float operator()(float x) const { return WrapInt(UInt(x) * UInt(x)); }
};
struct IntAbsFn {
  // abs(INT_MIN) wraps to INT_MIN, as XLA's.
  float operator()(float x) const { return WordToInt(x) < 0 ? WrapInt(0u - UInt(x)) : x; }
};

// Calls fn with the functor of `kind`.
template <typename Fn>
void DispatchBinary(BinaryKind kind, Fn fn) {
  switch (kind) {
    case BinaryKind::kAdd:
      return fn(AddFn{});
    case BinaryKind::kSub:
      return fn(SubFn{});
    case BinaryKind::kMul:
      return fn(MulFn{});
    case BinaryKind::kDiv:
      return fn(DivFn{});
    case BinaryKind::kMax:
      return fn(MaxFn{});
  }
}

// Calls fn with the functor of `kind`.
template <typename Fn>
void DispatchUnary(OpKind kind, Fn fn) {
  switch (kind) {
    case OpKind::kRelu:
      return fn(ReluFn{});
    case OpKind::kGelu:
      return fn(GeluFn{});
    case OpKind::kExp:
      return fn(ExpFn{});
    case OpKind::kTanh:
      return fn(TanhFn{});
    case OpKind::kNeg:
      return fn(NegFn{});
    case OpKind::kSilu:
      return fn(SiluFn{});
    case OpKind::kLog:
      return fn(LogFn{});
    case OpKind::kSqrt:
      return fn(SqrtFn{});
    case OpKind::kRsqrt:
      return fn(RsqrtFn{});
    case OpKind::kSquare:
      return fn(SquareFn{});
    case OpKind::kAbs:
      return fn(AbsFn{});
    case OpKind::kSin:
      return fn(SinFn{});
    case OpKind::kCos:
      return fn(CosFn{});
    default:
      throw std::logic_error(std::string("internal error: ") + OpKindName(kind) +
                             " has no elementwise kernel");
  }
}

// Calls fn with the i32 functor of `kind` (div is never i32: it promotes to f32).
template <typename Fn>
void DispatchIntBinary(BinaryKind kind, Fn fn) {
  switch (kind) {
    case BinaryKind::kAdd:
      return fn(IntAddFn{});
    case BinaryKind::kSub:
      return fn(IntSubFn{});
    case BinaryKind::kMul:
      return fn(IntMulFn{});
    case BinaryKind::kMax:
      return fn(IntMaxFn{});
    case BinaryKind::kDiv:
      assert(false && "i32 division promotes to f32");
      return;
  }
}

const char* BinaryName(BinaryKind kind) {
  switch (kind) {
    case BinaryKind::kAdd:
      return "add";
    case BinaryKind::kSub:
      return "sub";
    case BinaryKind::kMul:
      return "mul";
    case BinaryKind::kDiv:
      return "div";
    case BinaryKind::kMax:
      return "max";
  }
  return "binary";
}

// out[i] = f(a[ia], b[ib]) over the broadcast `shape`, with a's and b's strides in it.
template <typename F>
void BroadcastApply(F f, const float* a, const float* b, float* out, Shape shape,
                    std::vector<int64_t> sa, std::vector<int64_t> sb) {
  if (NumElements(shape) == 0) return;
  Coalesce(shape, {&sa, &sb});
  int r = static_cast<int>(shape.size());
  if (r == 0) {
    out[0] = f(a[0], b[0]);
    return;
  }
  int64_t len = shape[r - 1], ia = sa[r - 1], ib = sb[r - 1];
  ForEachOuter<2>(shape, r - 1, {&sa, &sb}, [&](const std::array<int64_t, 2>& off) {
    const float* pa = a + off[0];
    const float* pb = b + off[1];
    if (ia == 1 && ib == 1) {
      for (int64_t j = 0; j < len; ++j) out[j] = f(pa[j], pb[j]);
    } else if (ia == 1 && ib == 0) {
      float y = pb[0];
      for (int64_t j = 0; j < len; ++j) out[j] = f(pa[j], y);
    } else if (ia == 0 && ib == 1) {
      float x = pa[0];
      for (int64_t j = 0; j < len; ++j) out[j] = f(x, pb[j]);
    } else {
      for (int64_t j = 0; j < len; ++j) out[j] = f(pa[j * ia], pb[j * ib]);
    }
    out += len;
  });
}

// The letters of a parsed two-operand einsum and each letter's size.
struct EinsumPlan {
  std::string a, b, out;            // Letters of each operand and of the output.
  std::array<int64_t, 128> size{};  // Size of each letter (by ASCII code).
};

// Parses and checks `spec` against the operands' shapes.
EinsumPlan ParseEinsum(const std::string& spec, const Array& a, const Array& b) {
  const char* op = "einsum";
  std::string s;
  for (char c : spec) {
    if (c != ' ') s += c;
  }
  std::string quoted = "\"" + spec + "\"";
  if (s.find("...") != std::string::npos) Fail(op, "ellipsis (...) is not supported: " + quoted);
  size_t arrow = s.find("->");
  std::string lhs = arrow == std::string::npos ? s : s.substr(0, arrow);
  size_t comma = lhs.find(',');
  if (comma == std::string::npos || lhs.find(',', comma + 1) != std::string::npos) {
    Fail(op, quoted + " must name exactly two operands, like \"bd,df->bf\"");
  }
  EinsumPlan plan;
  plan.a = lhs.substr(0, comma);
  plan.b = lhs.substr(comma + 1);
  for (const std::string* part : {&plan.a, &plan.b}) {
    for (char c : *part) {
      if (!std::isalpha(static_cast<unsigned char>(c))) {
        Fail(op, std::string("invalid character '") + c + "' in " + quoted);
      }
    }
  }
  if (arrow != std::string::npos) {
    plan.out = s.substr(arrow + 2);
    for (char c : plan.out) {
      if (!std::isalpha(static_cast<unsigned char>(c))) {
        Fail(op, std::string("invalid character '") + c + "' in the output of " + quoted);
      }
    }
  } else {  // Implicit mode: letters seen once, sorted.
    std::string all = plan.a + plan.b;
    for (char c : all) {
      if (std::count(all.begin(), all.end(), c) == 1) plan.out += c;
    }
    std::sort(plan.out.begin(), plan.out.end());
  }
  const std::array<std::pair<const std::string*, const Array*>, 2> operands = {
      {{&plan.a, &a}, {&plan.b, &b}}};
  std::array<int, 128> owner{};  // 1 + the operand that fixed a letter's size, or 0.
  for (int i = 0; i < 2; ++i) {
    const std::string& letters = *operands[i].first;
    const Array& arr = *operands[i].second;
    if (static_cast<int>(letters.size()) != arr.rank()) {
      Fail(op, "operand " + std::to_string(i) + " has " + std::to_string(letters.size()) +
                   " letters ('" + letters + "') but is " + arr.TypeString() + " in " + quoted);
    }
    for (size_t d = 0; d < letters.size(); ++d) {
      int c = static_cast<unsigned char>(letters[d]);
      if (letters.find(letters[d], d + 1) != std::string::npos) {
        Fail(op, std::string("letter '") + letters[d] + "' repeats in operand " +
                     std::to_string(i) + " ('" + letters + "'); diagonals are not supported");
      }
      if (owner[c] != 0 && plan.size[c] != arr.shape()[d]) {
        Fail(op, std::string("letter '") + letters[d] + "' has size " +
                     std::to_string(plan.size[c]) + " in operand 0 and " +
                     std::to_string(arr.shape()[d]) + " in operand 1: " + a.TypeString() + ", " +
                     b.TypeString() + " in " + quoted);
      }
      plan.size[c] = arr.shape()[d];
      owner[c] = i + 1;
    }
  }
  for (size_t d = 0; d < plan.out.size(); ++d) {
    int c = static_cast<unsigned char>(plan.out[d]);
    if (owner[c] == 0) {
      Fail(op,
           std::string("output letter '") + plan.out[d] + "' is in neither operand of " + quoted);
    }
    if (plan.out.find(plan.out[d], d + 1) != std::string::npos) {
      Fail(op, std::string("output letter '") + plan.out[d] + "' repeats in " + quoted);
    }
  }
  return plan;
}

// Whether `letters` contains c.
bool Has(const std::string& letters, char c) { return letters.find(c) != std::string::npos; }

// An einsum operand: its letters, shape and values (borrowed or owned).
struct Operand {
  std::string letters;
  Shape shape;
  const float* data = nullptr;
  std::vector<float> owned;
};

// Sums away the operand's letters that are in neither `other` nor `out`.
void SumAway(Operand& op, const std::string& other, const std::string& out, bool ints) {
  std::vector<int> perm;
  std::string kept;
  Shape kept_shape;
  int64_t reduced = 1;
  for (size_t d = 0; d < op.letters.size(); ++d) {
    if (Has(other, op.letters[d]) || Has(out, op.letters[d])) {
      perm.push_back(static_cast<int>(d));
      kept += op.letters[d];
      kept_shape.push_back(op.shape[d]);
    }
  }
  if (kept.size() == op.letters.size()) return;
  for (size_t d = 0; d < op.letters.size(); ++d) {
    if (!Has(kept, op.letters[d])) {
      perm.push_back(static_cast<int>(d));
      reduced *= op.shape[d];
    }
  }
  std::vector<float> moved(static_cast<size_t>(NumElements(op.shape)));
  Permute(op.data, op.shape, perm, moved.data());
  int64_t rows = NumElements(kept_shape);
  std::vector<float> sums(static_cast<size_t>(rows), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = moved.data() + i * reduced;
    if (ints) {  // Wrapping int32 sum.
      uint32_t acc = 0;
      for (int64_t j = 0; j < reduced; ++j) acc += UInt(row[j]);
      sums[i] = WrapInt(acc);
    } else {
      float acc = 0.0f;
      for (int64_t j = 0; j < reduced; ++j) acc += row[j];
      sums[i] = acc;
    }
  }
  op.letters = kept;
  op.shape = kept_shape;
  op.owned = std::move(sums);
  op.data = op.owned.data();
}

// Brings the operand into the letter order `first` + `second` + `third` for sgemm: returns
// whether the matrix is to be read transposed (its letters are `first` + `third` +
// `second`), copying into that order if it is in neither.
bool Arrange(Operand& op, const std::string& first, const std::string& second,
             const std::string& third) {
  std::string plain = first + second + third;
  if (op.letters == plain) return false;
  if (op.letters == first + third + second) return true;
  std::vector<int> perm;
  Shape shape;
  for (char c : plain) {
    size_t d = op.letters.find(c);
    perm.push_back(static_cast<int>(d));
    shape.push_back(op.shape[d]);
  }
  std::vector<float> moved(static_cast<size_t>(NumElements(op.shape)));
  Permute(op.data, op.shape, perm, moved.data());
  op.letters = plain;
  op.shape = shape;
  op.owned = std::move(moved);
  op.data = op.owned.data();
  return false;
}

// Size of a group of einsum letters.
int64_t LettersSize(const EinsumPlan& plan, const std::string& letters) {
  int64_t n = 1;
  for (char c : letters) n *= plan.size[static_cast<unsigned char>(c)];
  return n;
}

// The shared body of Concatenate and ConcatAlong.
Array ConcatImpl(const std::vector<const Array*>& arrays, int64_t axis) {
  const char* op = "concatenate";
  if (arrays.empty()) Fail(op, "needs at least one array");
  const Array& first = *arrays[0];
  int r = first.rank();
  if (r == 0) Fail(op, "zero-rank arrays cannot be concatenated: " + first.TypeString());
  int ax = NormalizeAxis(op, axis, r, first.TypeString());
  Shape shape = first.shape();
  DType dtype = first.dtype();
  bool shape_only = false;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = *arrays[i];
    bool same = a.rank() == r;
    for (int d = 0; same && d < r; ++d) same = d == ax || a.shape()[d] == first.shape()[d];
    if (!same) {
      Fail(op, "shapes differ outside axis " + std::to_string(ax) + ": " + first.TypeString() +
                   " and " + a.TypeString());
    }
    if (i > 0) {
      shape[ax] += a.shape()[ax];
      dtype = PromoteTypes(dtype, a.dtype());
    }
    shape_only = shape_only || !a.has_data();
  }
  if (shape_only) return Array::ShapeOnly(dtype, shape);
  std::vector<Array> holders(arrays.size());
  std::vector<const float*> sources(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    sources[i] = AsDType(*arrays[i], dtype, holders[i]).data();
  }
  // Appended in output order into reserved storage: no zero fill of a buffer about to be
  // overwritten.
  std::vector<float> values;
  values.reserve(static_cast<size_t>(NumElements(shape)));
  int64_t outer = Product(shape, 0, ax);
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < arrays.size(); ++i) {
      int64_t inner = Product(arrays[i]->shape(), ax, r);
      values.insert(values.end(), sources[i] + o * inner, sources[i] + (o + 1) * inner);
    }
  }
  return Array::FromWords(dtype, shape, std::move(values));  // Sources are in dtype already.
}

}  // namespace

std::optional<BinaryKind> BinaryKindOf(OpKind kind) {
  switch (kind) {
    case OpKind::kAdd:
      return BinaryKind::kAdd;
    case OpKind::kSub:
      return BinaryKind::kSub;
    case OpKind::kMul:
      return BinaryKind::kMul;
    case OpKind::kDiv:
      return BinaryKind::kDiv;
    case OpKind::kMax:
      return BinaryKind::kMax;
    default:
      return std::nullopt;
  }
}

bool IsUnary(OpKind kind) {
  const OpDef& def = Op(kind);
  return def.elementwise && def.arity == OpArity::kOne && kind != OpKind::kConvert;
}

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kI32) return b;
  if (b == DType::kI32) return a;
  // An 8-bit float meets a wider float: the wider one (JAX has no implicit promotion path
  // for float8 and wants a convert; fused FP8 kernels dequantize their operands, which this
  // follows). The two 8-bit floats meet in bf16, which holds both ranges.
  if (IsFloat8(a) && IsFloat8(b)) return DType::kBF16;
  if (IsFloat8(a)) return b;
  if (IsFloat8(b)) return a;
  return DType::kF32;
}

namespace {

// A contraction's result type: `result` when given (a float type for float operands), else the
// operands' promoted `operands`.
DType ResultDType(const char* op, DType operands, std::optional<DType> result) {
  if (!result) return operands;
  if (operands == DType::kI32 || *result == DType::kI32) {
    Fail(op, std::string("preferred_element_type ") + DTypeName(*result) + " of " +
                 DTypeName(operands) + " operands: both must be floating types");
  }
  return *result;
}

}  // namespace

Array Matmul(const Array& a, const Array& b, std::optional<DType> result) {
  const char* op = "matmul";
  std::string types = a.TypeString() + " @ " + b.TypeString();
  if (a.rank() == 0 || b.rank() == 0) Fail(op, "operands must have rank >= 1: " + types);
  Shape as = a.shape(), bs = b.shape();
  bool a_vector = as.size() == 1, b_vector = bs.size() == 1;
  if (a_vector) as.insert(as.begin(), 1);
  if (b_vector) bs.push_back(1);
  int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k) Fail(op, "inner dimensions differ: " + types);
  Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  std::optional<Shape> batch = BroadcastShapes(a_batch, b_batch);
  if (!batch) Fail(op, "batch dimensions cannot be broadcast: " + types);
  Shape shape = *batch;
  if (!a_vector) shape.push_back(m);
  if (!b_vector) shape.push_back(n);
  DType dtype = PromoteTypes(a.dtype(), b.dtype());
  const DType out_dtype = ResultDType(op, dtype, result);
  if (AnyShapeOnly({&a, &b})) return Array::ShapeOnly(out_dtype, shape);
  const bool ints = dtype == DType::kI32;
  Array a_holder, b_holder;
  const Array& ac = AsDType(a, dtype, a_holder);
  const Array& bc = AsDType(b, dtype, b_holder);
  Array out(out_dtype, shape);
  if (NumElements(b_batch) == 1) {  // One sgemm with a's batch folded into its rows.
    AnyGemm(ints, false, false, NumElements(a_batch) * m, n, k, ac.data(), k, bc.data(), n,
            out.data(), n);
  } else {
    std::vector<int64_t> sa = BroadcastStrides(a_batch, *batch);
    std::vector<int64_t> sb = BroadcastStrides(b_batch, *batch);
    float* c = out.data();
    ForEachOuter<2>(*batch, static_cast<int>(batch->size()), {&sa, &sb},
                    [&](const std::array<int64_t, 2>& off) {
                      AnyGemm(ints, false, false, m, n, k, ac.data() + off[0] * m * k, k,
                              bc.data() + off[1] * k * n, n, c, n);
                      c += m * n;
                    });
  }
  out.Round();
  return out;
}

Array Einsum(const std::string& spec, const Array& a, const Array& b, std::optional<DType> result) {
  EinsumPlan plan = ParseEinsum(spec, a, b);
  Shape shape;
  for (char c : plan.out) shape.push_back(plan.size[static_cast<unsigned char>(c)]);
  DType dtype = PromoteTypes(a.dtype(), b.dtype());
  const DType out_dtype = ResultDType("einsum", dtype, result);
  if (AnyShapeOnly({&a, &b})) return Array::ShapeOnly(out_dtype, shape);
  const bool ints = dtype == DType::kI32;
  Array a_holder, b_holder;
  const Array& ac = AsDType(a, dtype, a_holder);
  const Array& bc = AsDType(b, dtype, b_holder);

  Operand x{plan.a, a.shape(), ac.data(), {}};
  Operand y{plan.b, b.shape(), bc.data(), {}};
  SumAway(x, plan.b, plan.out, ints);
  SumAway(y, plan.a, plan.out, ints);
  std::string batch, x_free, y_free, contracted;
  for (char c : plan.out) {
    if (Has(x.letters, c) && Has(y.letters, c)) {
      batch += c;
    } else if (Has(x.letters, c)) {
      x_free += c;
    } else {
      y_free += c;
    }
  }
  for (char c : x.letters) {
    if (!Has(plan.out, c)) contracted += c;  // Also in y, after SumAway.
  }
  bool trans_x = Arrange(x, batch, x_free, contracted);
  bool trans_y = Arrange(y, batch, contracted, y_free);
  int64_t nb = LettersSize(plan, batch), m = LettersSize(plan, x_free);
  int64_t n = LettersSize(plan, y_free), k = LettersSize(plan, contracted);

  Array out(out_dtype, shape);
  std::string result_letters = batch + x_free + y_free;
  std::vector<float> temp;
  float* c = out.data();
  if (result_letters != plan.out) {
    temp.assign(static_cast<size_t>(out.size()), 0.0f);
    c = temp.data();
  }
  for (int64_t t = 0; t < nb; ++t) {
    AnyGemm(ints, trans_x, trans_y, m, n, k, x.data + t * m * k, trans_x ? m : k,
            y.data + t * k * n, trans_y ? k : n, c + t * m * n, n);
  }
  if (!temp.empty()) {
    Shape result_shape;
    for (char ch : result_letters)
      result_shape.push_back(plan.size[static_cast<unsigned char>(ch)]);
    std::vector<int> perm;
    for (char ch : plan.out) perm.push_back(static_cast<int>(result_letters.find(ch)));
    Permute(temp.data(), result_shape, perm, out.data());
  }
  out.Round();
  return out;
}

int64_t EinsumContractionLength(const std::string& spec, const Array& a, const Array& b) {
  EinsumPlan plan = ParseEinsum(spec, a, b);
  std::string summed;
  for (char c : plan.a + plan.b) {
    if (!Has(plan.out, c) && !Has(summed, c)) summed += c;
  }
  return LettersSize(plan, summed);
}

Array Binary(BinaryKind kind, const Array& a, const Array& b) {
  const char* op = BinaryName(kind);
  std::optional<Shape> shape = BroadcastShapes(a.shape(), b.shape());
  if (!shape) {
    Fail(op, "shapes " + a.TypeString() + " and " + b.TypeString() + " cannot be broadcast");
  }
  DType dtype = PromoteTypes(a.dtype(), b.dtype());
  if (kind == BinaryKind::kDiv && dtype == DType::kI32) dtype = DType::kF32;  // True division.
  if (AnyShapeOnly({&a, &b})) return Array::ShapeOnly(dtype, *shape);
  Array a_holder, b_holder;
  const Array& ac = AsDType(a, dtype, a_holder);
  const Array& bc = AsDType(b, dtype, b_holder);
  Array out(dtype, *shape);
  auto apply = [&](auto f) {
    BroadcastApply(f, ac.data(), bc.data(), out.data(), *shape, BroadcastStrides(a.shape(), *shape),
                   BroadcastStrides(b.shape(), *shape));
  };
  if (dtype == DType::kI32) {
    DispatchIntBinary(kind, apply);
  } else {
    DispatchBinary(kind, apply);
  }
  out.Round();
  return out;
}

Array BinaryScalar(BinaryKind kind, const Array& a, double scalar) {
  DType dtype = a.dtype();
  // As JAX: an i32 array with a non-integral (float) scalar, or divided, gives f32.
  if (dtype == DType::kI32 && (kind == BinaryKind::kDiv || scalar != std::nearbyint(scalar))) {
    dtype = DType::kF32;
  }
  if (!a.has_data()) return Array::ShapeOnly(dtype, a.shape());
  Array holder;
  const float* x = AsDType(a, dtype, holder).data();
  Array out(dtype, a.shape());
  float* o = out.data();
  int64_t n = a.size();
  if (dtype == DType::kI32) {  // An integral scalar, as an int32 (wrapping like XLA's).
    float s = WrapInt(static_cast<uint32_t>(static_cast<int64_t>(scalar)));
    DispatchIntBinary(kind, [&](auto f) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], s);
    });
    return out;
  }
  float s = RoundToDType(dtype, static_cast<float>(scalar));  // The scalar takes the dtype.
  DispatchBinary(kind, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], s);
  });
  out.Round();
  return out;
}

Array Unary(OpKind kind, const Array& a) {
  DType dtype = a.dtype();
  // Ops whose integer results stay integers: relu, neg, square and abs; the others of an i32
  // operand compute in f32 (JAX promotes integer inputs of transcendental functions).
  bool integral = kind == OpKind::kRelu || kind == OpKind::kNeg || kind == OpKind::kSquare ||
                  kind == OpKind::kAbs;
  if (dtype == DType::kI32 && !integral) dtype = DType::kF32;
  if (!a.has_data()) return Array::ShapeOnly(dtype, a.shape());
  Array holder;
  const float* x = AsDType(a, dtype, holder).data();
  Array out(dtype, a.shape());
  float* o = out.data();
  int64_t n = a.size();
  if (dtype == DType::kI32) {  // Wrapping like XLA: neg and abs of INT_MIN give INT_MIN.
    auto apply = [&](auto f) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    };
    if (kind == OpKind::kNeg) {
      apply(IntNegFn{});
    } else if (kind == OpKind::kSquare) {
      apply(IntSquareFn{});
    } else if (kind == OpKind::kAbs) {
      apply(IntAbsFn{});
    } else {
      apply(IntReluFn{});
    }
    return out;
  }
  DispatchUnary(kind, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
  });
  out.Round();
  return out;
}

Array ConvertElementType(const Array& a, DType dtype, bool saturate) {
  if (a.dtype() == dtype) return a;
  if (!a.has_data()) return Array::ShapeOnly(dtype, a.shape());
  if (saturate && dtype != DType::kI32 && a.dtype() != DType::kI32) {
    const float top = LargestFinite(dtype);
    std::vector<float> clamped = a.values();
    for (float& v : clamped) {
      if (!std::isnan(v)) v = std::clamp(v, -top, top);
    }
    return ConvertTo(Array::FromValues(a.dtype(), a.shape(), std::move(clamped)), dtype);
  }
  if (dtype != DType::kI32) return ConvertTo(a, dtype);
  std::vector<float> words(static_cast<size_t>(a.size()));
  const float* x = a.data();
  for (int64_t i = 0; i < a.size(); ++i) {
    double v = std::trunc(static_cast<double>(x[i]));
    int32_t w = std::isnan(v) ? 0
                : v <= static_cast<double>(std::numeric_limits<int32_t>::min())
                    ? std::numeric_limits<int32_t>::min()
                : v >= static_cast<double>(std::numeric_limits<int32_t>::max())
                    ? std::numeric_limits<int32_t>::max()
                    : static_cast<int32_t>(v);
    words[i] = IntToWord(w);
  }
  return Array::FromValues(dtype, a.shape(), std::move(words));
}

Array Reshape(const Array& a, const Shape& shape) {
  const char* op = "reshape";
  Shape resolved = shape;
  int inferred = -1;
  int64_t known = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (inferred >= 0) Fail(op, "only one dimension may be -1 in " + FormatShape(shape));
      inferred = static_cast<int>(d);
    } else if (shape[d] < 0) {
      Fail(op, "negative dimension in " + FormatShape(shape));
    } else {
      known *= shape[d];
    }
  }
  std::string what = "cannot reshape " + a.TypeString() + " (" + std::to_string(a.size()) +
                     " elements) into " + FormatShape(shape);
  if (inferred >= 0) {
    if (known == 0 || a.size() % known != 0) Fail(op, what);
    resolved[inferred] = a.size() / known;
  } else if (known != a.size()) {
    Fail(op, what);
  }
  if (!a.has_data()) return Array::ShapeOnly(a.dtype(), resolved);
  Array out(a.dtype(), resolved);
  std::memcpy(out.data(), a.data(), static_cast<size_t>(a.size()) * sizeof(float));
  return out;
}

Array Transpose(const Array& a, const std::vector<int64_t>& axes) {
  const char* op = "transpose";
  int r = a.rank();
  std::vector<int> perm(static_cast<size_t>(r));
  if (axes.empty()) {
    for (int d = 0; d < r; ++d) perm[d] = r - 1 - d;
  } else {
    std::string listed = "[";
    for (size_t i = 0; i < axes.size(); ++i) {
      if (i > 0) listed += ',';
      listed += std::to_string(axes[i]);
    }
    listed += "]";
    std::string what = "axes " + listed + " are not a permutation of the " + std::to_string(r) +
                       " dimensions of " + a.TypeString();
    if (static_cast<int>(axes.size()) != r) Fail(op, what);
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (int i = 0; i < r; ++i) {
      if (axes[i] < -r || axes[i] >= r) Fail(op, what);
      perm[i] = static_cast<int>(axes[i] < 0 ? axes[i] + r : axes[i]);
      if (seen[perm[i]]) Fail(op, what);
      seen[perm[i]] = true;
    }
  }
  Shape shape(static_cast<size_t>(r));
  for (int d = 0; d < r; ++d) shape[d] = a.shape()[perm[d]];
  if (!a.has_data()) return Array::ShapeOnly(a.dtype(), shape);
  Array out(a.dtype(), shape);
  Permute(a.data(), a.shape(), perm, out.data());
  return out;
}

Array Concatenate(const std::vector<const Array*>& arrays, int64_t axis) {
  return ConcatImpl(arrays, axis);
}

std::vector<Array> Split(const Array& a, int64_t sections, int64_t axis) {
  const char* op = "split";
  if (a.rank() == 0) Fail(op, "a zero-rank array cannot be split: " + a.TypeString());
  int ax = NormalizeAxis(op, axis, a.rank(), a.TypeString());
  int64_t dim = a.shape()[ax];
  if (sections <= 0 || dim % sections != 0) {
    Fail(op, "dimension " + std::to_string(ax) + " of " + a.TypeString() + " (size " +
                 std::to_string(dim) + ") does not split into " + std::to_string(sections) +
                 " equal sections");
  }
  std::vector<Array> parts;
  int64_t size = dim / sections;
  for (int64_t i = 0; i < sections; ++i) parts.push_back(Slice(a, i * size, size, ax));
  return parts;
}

Array Slice(const Array& a, int64_t start, int64_t size, int64_t axis) {
  const char* op = "slice";
  if (a.rank() == 0) Fail(op, "a zero-rank array cannot be sliced: " + a.TypeString());
  int ax = NormalizeAxis(op, axis, a.rank(), a.TypeString());
  int64_t dim = a.shape()[ax];
  if (start < 0 || size < 0 || start > dim || size > dim - start) {
    Fail(op, "start " + std::to_string(start) + " and size " + std::to_string(size) +
                 " do not fit in dimension " + std::to_string(ax) + " (size " +
                 std::to_string(dim) + ") of " + a.TypeString());
  }
  Shape shape = a.shape();
  shape[ax] = size;
  if (!a.has_data()) return Array::ShapeOnly(a.dtype(), shape);
  Array out(a.dtype(), shape);
  int64_t outer = Product(a.shape(), 0, ax);
  int64_t inner = Product(a.shape(), ax + 1, a.shape().size());
  int64_t chunk = size * inner;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + o * chunk, a.data() + (o * dim + start) * inner,
                static_cast<size_t>(chunk) * sizeof(float));
  }
  return out;
}

Array SliceAlong(const Array& a, int axis, int64_t start, int64_t size) {
  return Slice(a, start, size, axis);
}

Array ConcatAlong(const std::vector<Array>& arrays, int axis) {
  std::vector<const Array*> pointers;
  pointers.reserve(arrays.size());
  for (const Array& a : arrays) pointers.push_back(&a);
  return ConcatImpl(pointers, axis);
}

Array Stack(const std::vector<Array>& arrays, int axis) {
  const char* op = "stack";
  if (arrays.empty()) Fail(op, "needs at least one array");
  const Array& first = arrays[0];
  int r = first.rank();
  if (axis < -(r + 1) || axis > r) {
    Fail(op, "axis " + std::to_string(axis) + " is out of range for stacking " +
                 first.TypeString() + " (a new axis is in [" + std::to_string(-(r + 1)) + ", " +
                 std::to_string(r) + "])");
  }
  int ax = static_cast<int>(axis < 0 ? axis + r + 1 : axis);
  DType dtype = first.dtype();
  bool shape_only = false;
  for (const Array& a : arrays) {
    if (a.shape() != first.shape()) {
      Fail(op, "shapes differ: " + first.TypeString() + " and " + a.TypeString());
    }
    dtype = PromoteTypes(dtype, a.dtype());
    shape_only = shape_only || !a.has_data();
  }
  Shape shape = first.shape();
  shape.insert(shape.begin() + ax, static_cast<int64_t>(arrays.size()));
  if (shape_only) return Array::ShapeOnly(dtype, shape);
  std::vector<Array> holders(arrays.size());
  std::vector<const float*> sources(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    sources[i] = AsDType(arrays[i], dtype, holders[i]).data();
  }
  Array out(dtype, shape);
  int64_t outer = Product(first.shape(), 0, ax);
  int64_t inner = Product(first.shape(), ax, r);
  float* dst = out.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const float* src : sources) {
      std::memcpy(dst, src + o * inner, static_cast<size_t>(inner) * sizeof(float));
      dst += inner;
    }
  }
  return out;
}

OpCost LocalOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                   const std::vector<const Array*>& outputs) {
  if (op.kind == OpKind::kCustomCall) return OpCost{op.flops.value_or(0), op.bytes.value_or(0)};
  if (IsGradOp(op.kind)) return GradOpCost(op, inputs, outputs);
  if (IsNnOp(op.kind)) return NnOpCost(op, inputs, outputs);
  return LocalOpCost(op.kind, inputs, outputs, op.spec);
}

OpCost LocalOpCost(OpKind kind, const std::vector<const Array*>& inputs,
                   const std::vector<const Array*>& outputs, const std::string& einsum_spec) {
  double in_bytes = 0, out_bytes = 0, out_elements = 0;
  for (const Array* a : inputs) in_bytes += static_cast<double>(a->bytes().count());
  for (const Array* a : outputs) {
    out_bytes += static_cast<double>(a->bytes().count());
    out_elements += static_cast<double>(a->size());
  }
  OpCost cost{0, in_bytes + out_bytes};
  // take_shard costs what take does on the block.
  if (kind == OpKind::kTakeShard) kind = OpKind::kTake;
  if (IsNnOp(kind) || IsGradOp(kind)) {  // Their attributes at the defaults (attention causal).
    OpSpec op;
    op.kind = kind;
    return IsNnOp(kind) ? NnOpCost(op, inputs, outputs) : GradOpCost(op, inputs, outputs);
  }
  if (BinaryKindOf(kind) || Op(kind).elementwise) {
    cost.flops = out_elements;
    return cost;
  }
  switch (kind) {
    case OpKind::kMatmul: {
      assert(inputs.size() == 2 && inputs[0]->rank() >= 1);
      cost.flops = 2.0 * out_elements * static_cast<double>(inputs[0]->shape().back());
      return cost;
    }
    case OpKind::kEinsum: {
      assert(inputs.size() == 2);
      EinsumPlan plan = ParseEinsum(einsum_spec, *inputs[0], *inputs[1]);
      std::string letters = plan.out;  // The product's letters: output and shared ones.
      for (char c : plan.a) {
        if (Has(plan.b, c) && !Has(letters, c)) letters += c;
      }
      cost.flops = 2.0 * static_cast<double>(LettersSize(plan, letters));
      for (int i = 0; i < 2; ++i) {
        const std::string& own = i == 0 ? plan.a : plan.b;
        const std::string& other = i == 0 ? plan.b : plan.a;
        bool sums = false;
        for (char c : own) sums = sums || (!Has(other, c) && !Has(plan.out, c));
        if (sums) cost.flops += static_cast<double>(inputs[i]->size());
      }
      return cost;
    }
    case OpKind::kReshape:
      return OpCost{0, 0};
    case OpKind::kSlice:
      return OpCost{0, 2 * out_bytes};
    case OpKind::kTranspose:
    case OpKind::kConcatenate:
    case OpKind::kSplit:
      return cost;
    case OpKind::kAxisIndex:
      return OpCost{0, out_bytes};
    default:
      assert(false && "LocalOpCost of a collective op");
      return cost;
  }
}

DType CostDType(const OpSpec& op, const std::vector<const Array*>& inputs,
                const std::vector<const Array*>& outputs) {
  if ((op.kind == OpKind::kMatmul || op.kind == OpKind::kEinsum) && inputs.size() == 2) {
    // Two 8-bit floats (an f8e5m2 cotangent by f8e4m3 weights) run on the FP8 units too.
    if (IsFloat8(inputs[0]->dtype()) && IsFloat8(inputs[1]->dtype())) return inputs[0]->dtype();
    return PromoteTypes(inputs[0]->dtype(), inputs[1]->dtype());
  }
  return outputs.empty() ? DType::kF32 : outputs[0]->dtype();
}

}  // namespace shardsim
