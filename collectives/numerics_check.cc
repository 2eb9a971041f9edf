#include "collectives/numerics_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "collectives/device_put.h"
#include "collectives/grad_ops.h"
#include "collectives/init.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/lowering.h"
#include "collectives/nn_ops.h"
#include "collectives/outputs.h"
#include "collectives/ragged_all_to_all.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"

namespace shardsim {
namespace {

// ErrorBoundModel: how far a simulated value may lie from the reference, op by op.
//
// The simulation and the reference run the same local op code on their inputs, so a local op
// whose inputs agree exactly gives bit-identical results (except a contraction against a
// reference that runs it on other shapes: see matmul/einsum). Values differ only where the
// computation differs: (1) reducing collectives (psum, pmean, psum_scatter): the algorithms add
// the G members' blocks in float32 in their own order and round to the dtype once, the
// reference adds in double in member order and rounds once; (2) collective matmuls: the
// simulation runs the seed notebook's loop (partial matmuls over K or row/column blocks, each
// rounded to the dtype, added step by step and rounded again), the reference one matmul (and
// a psum_scatter); and (3) every op downstream of such a difference, which carries it on.
//
// Each value v carries two numbers, over every element of every position's block:
//   max(v): a bound on |sim - ref|, the quantity the check compares against;
//   rms(v): the root-mean-square scale of that difference (sums of n independent rounding
//           errors grow like sqrt(n), not n);
// and the reference's own statistics: M(v) = max |v|, R(v) = rms |v| (finite elements only).
// u(dtype) is the unit roundoff (2^-24 f32, 2^-8 bf16, 2^-11 f16, 0 for i32, which is
// exact); u32 = 2^-24; kSigmas = 5. Independent error sources add in quadrature in rms (x (+)
// y = sqrt(x^2 + y^2)) and linearly in max.
//
// Rounding: when two exact results differ, their roundings to the dtype may land one ulp
// apart: + 2 u M(out) to max, (+) u R(out) to rms ("rounding term").
// Local ops (inputs' errors e_i); an op whose inputs are all exact stays exact:
//   data movement (reshape, transpose, slice, split, concatenate, the dynamic slices and
//     concatenations, all_gather, all_to_all, ppermute, pmax, pmin, max, relu, neg):
//     1-Lipschitz and exact: max = max_i max(e_i), rms = max_i rms(e_i).
//   add/sub: max e_a + e_b, rms e_a (+) e_b (the operands' errors taken as uncorrelated);
//     mul: |a| e_b + |b| e_a + e_a e_b (M for |a|, |b| in max, R in rms); div: e_a / min|b|
//     + M(a) e_b / min|b|^2 (unbounded if min|b| <= 2 e_b); scalar ops scale by |s| (mul),
//     1/|s| (div) or 1; exp: M(out) e^{e_a} e_a; tanh, sin, cos: e_a (1-Lipschitz); gelu:
//     1.13 e_a and silu: 1.1 e_a (their largest slopes); square: 2|a| e_a + e_a^2; log and
//     rsqrt: e_a times the largest slope over [min|a| - e_a, inf) (unbounded if min|a| <=
//     2 e_a); sqrt: min(sqrt(e_a), e_a / (2 sqrt(min|a| - e_a))); convert: e_a rounded to
//     the new dtype, plus one unit when truncating to i32; custom_call, full_like: exact
//     (constants); plus the rounding term.
//   derivative ops (grad_ops.h): broadcast_in_dim and pad move data (as above); unary_grad
//     g f'(x): D1 e_g + (M_g + e_g) D2 e_x with D1, D2 bounds on |f'|, |f''| over x's range
//     (unbounded for sqrt and rsqrt if min|x| <= 2 e_x), plus, for relu and abs, a jump of 1
//     or 2 times M_g when x may cross 0 (min|x| <= e_x); max_grad and reduce_max_grad g m:
//     e_g, plus M_g + e_g when a or b (x) is inexact (the mask m in [0, 1] may flip); the
//     grads of softmax, log_softmax, the norms, take, cross_entropy, top_k and attention:
//     first-order bounds through the forward op's Jacobian, derived beside each case of
//     GradOpError (M_g counts g's own error in); plus the rounding term.
//   matmul/einsum with K products per output: sum_k (a + da)(b + db) - ab has K terms of
//     size <= e_a |b| + e_b |a| + e_a e_b: worst case K (e_a M_b + e_b M_a + e_a e_b); with
//     independent signs the rms is sqrt(K) (rms_a R_b + rms_b R_a + rms_a rms_b), so
//     max = min(worst case, kSigmas rms); when that is not zero, the float32 accumulation
//     of the K products runs on different values on the two sides, so its roundings differ
//     too: rms u32 K R_a R_b (as a collective matmul's), kSigmas times it in max; plus the
//     rounding term. Against a reference that adds the products in another order (the
//     partitioned check's: the global program on whole arrays, which BLAS blocks by shape,
//     and a contraction of K' = G K products that the sharded program splits into blocks and
//     a psum over G) the accumulations differ from exact operands too: rms u32 sqrt(K (K +
//     K') / 2) R_a R_b, u32 K R_a R_b when K' = K (derived beside the code).
//   The array ops of nn_ops.h compute in double and round once, so the same rounding term
//   covers them; what each passes on (x's error e_x, n the terms or the axis length):
//   sum of n terms as a matmul of length n: max min(n e_x, kSigmas sqrt(n) rms_x), rms
//     sqrt(n) rms_x; mean that over n; reduce_max: 1-Lipschitz (exact, as max).
//   softmax: s_i(x + d) / s_i(x) = e^{d_i} / sum_j s_j e^{d_j} lies in [e^{-2e}, e^{2e}], so
//     |ds_i| <= M(out) (e^{2 e_x} - 1); also the Jacobian diag(s) - s s^T has row sums of
//     |entries| 2 s_i (1 - s_i) <= 1/2, so |ds| <= e_x / 2: the smaller; rms min(2 R(out),
//     1/2) rms_x. log_softmax: x_i - logsumexp(x), logsumexp 1-Lipschitz: 2 e_x, 2 rms_x.
//   rms_norm, layer_norm: u = c / rho with c = x (rms) or x - mean(x) (layer) and rho =
//     sqrt(mean(c^2) + eps), the 2-norm of (c / sqrt(n), sqrt(eps)): |d rho| <= rms of dc <=
//     e_x (centering is a projection), and |dc_i| <= e_x (rms) or 2 e_x (layer). With rho_min
//     the smallest rho over the reference's rows (SmallestNormScale) and U = max |u| <=
//     min(sqrt(n), max|c| / rho_min), du = dc / rho' + u (rho - rho') / rho' gives
//     |du| <= e_x (1 or 2, + U) / (rho_min - e_x) (unbounded if rho_min <= 2 e_x), rms
//     2 rms_x / (rho_min - e_x); then y = u scale: e_u (M_s + e_s) + U e_s, rms likewise with
//     R_s and rms(u) <= 1.
//   take: data movement when the ids are exact; inexact ids may pick another row: 2 M(table)
//     plus its error (an id pushed out of range gives NaN, a mismatch no bound covers).
//   cross_entropy: logsumexp(x) - x_label per position, each term 1-Lipschitz: 2 e_x and
//     2 rms_x, kept by the mean; inexact labels may pick another logit: 2 M(x) + 2 e_x.
//   top_k: the j-th largest value is 1-Lipschitz (exact, as max); the indices of inexact
//     values may be any other index of the axis: n - 1.
//   one_hot, moe_route: exact from exact indices; inexact ones may flip any element (0 or
//     1): 1.
//   attention, logits l = q.k / sqrt(H) over H products, as a matmul: worst sqrt(H) (e_q M_k
//     + e_k M_q + e_q e_k), rms rms_q R_k + rms_k R_q + rms_q rms_k, max min(worst, kSigmas
//     rms); a row's probabilities p'_j = p_j e^{d_j} / sum_k p_k e^{d_k} (|d| <= e_l) then
//     move by at most p_j (e^{2 e_l} - 1) each and 2 in all (as softmax). The moves sum to 0,
//     so they weigh v_j - o (o = sum_j p_j v_j, the output): |sum_j (p'_j - p_j) v_j| <=
//     min(2 M_v, (e^{2 e_l} - 1) W), with W the largest spread sum_j p_j |v_j - o| over the
//     reference's outputs (small where a large logit makes the softmax peaked: the output
//     then barely moves, however large the logits' errors). Their rounding to the dtype moves
//     them by u (p + p') more; the rounded ones sum to at most 1 + u, so |do| <= min(2 M_v,
//     (e^{2 e_l} - 1) W) + 2 u M_v + (1 + u) e_v; to first order do = sum_j p_j (d_j -
//     sum_k p_k d_k) (v_j - o), rms 2 rms_l min(R_v, W_rms) + u R_v + rms_v (W_rms: the
//     spreads' rms); plus the rounding term.
// Reducing collectives over a group of G (the op's group, not the mesh):
//   psum/psum_scatter: the inputs' errors add: max = min(G max_in, kSigmas sqrt(G) rms_in),
//     rms = sqrt(G) rms_in. Float32 accumulation in another order: partial sums s_j
//     (j = 2..G) each round by <= u32 |s_j| <= u32 j M_in, so <= u32 G^2 M_in / 2 worst
//     case; with independent errors and |s_j| ~ sqrt(j) R_in, rms u32 G R_in. Plus the
//     rounding term. pmean divides all of it by G (and, for i32, is f32: u of f32). i32
//     sums are exact in any order (wrapping), so only the inputs' errors carry over.
// Collective matmuls over G devices, K products per output in total:
//   the inputs' errors as a matmul of length K; the loop's roundings: up to 2G roundings to
//   the dtype (G partial products, G - 1 adds) of values up to M(out): max
//   min(2G, kSigmas sqrt(2G)) u M(out), rms sqrt(2G) u R(out); float32 accumulation of K
//   products split differently: rms u32 sqrt(K) (sqrt(K) R_a R_b), max kSigmas rms; plus
//   the rounding term.
// Cap: a value's errors spread over its elements like its data (they scale with |v|), so
// their largest is at most max(kSigmas, M/R) times their rms; each value's max is capped
// there. Without the cap the worst-case terms compound through a deep program (a residual
// block both keeps and transforms its input's error: 2^depth); with it the bound grows like
// the rms, about sqrt(2) per residual block.
// The bound of an output is max(output); the check fails an output whose largest finite
// difference exceeds it. The rms estimates assume roughly independent errors (random data):
// data built to correlate rounding errors could exceed them, the worst-case terms could not.
constexpr double kSigmas = 5;
constexpr double kU32 = 1.0 / 16777216.0;  // 2^-24.

// Unit roundoff of a dtype (half its epsilon); 0 for i32, whose ops are exact.
double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    case DType::kF16:
      return std::ldexp(1.0, -11);
    case DType::kF8E4M3:
      return std::ldexp(1.0, -4);
    case DType::kF8E5M2:
      return std::ldexp(1.0, -3);
    case DType::kI32:
      return 0.0;
  }
  return 0.0;
}

// Statistics of a value over every position's block (finite elements).
struct Stats {
  double max_abs = 0;  // M.
  double rms = 0;      // R.
  double min_abs = std::numeric_limits<double>::infinity();
};

// The error of a value: a bound and an rms scale (see ErrorBoundModel).
struct Error {
  double max = 0;
  double rms = 0;
  bool exact() const { return max == 0 && rms == 0; }
};

Stats StatsOf(const std::vector<const Array*>& blocks) {
  Stats s;
  double sum_sq = 0;
  int64_t count = 0;
  for (const Array* a : blocks) {
    if (!a->has_data()) continue;
    if (a->dtype() == DType::kI32) {
      for (int64_t i = 0; i < a->size(); ++i) {
        double v = std::fabs(a->ValueAt(i));
        s.max_abs = std::max(s.max_abs, v);
        s.min_abs = std::min(s.min_abs, v);
        sum_sq += v * v;
      }
      count += a->size();
      continue;
    }
    // Floats: four independent lanes, so the loop pipelines (squares summed in double).
    const float* x = a->data();
    const int64_t n = a->size();
    float hi[4] = {0, 0, 0, 0}, lo[4];
    double sq[4] = {0, 0, 0, 0};
    int64_t finite[4] = {0, 0, 0, 0};
    for (float& l : lo) l = std::numeric_limits<float>::infinity();
    constexpr float kBig = std::numeric_limits<float>::max();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int k = 0; k < 4; ++k) {
        float v = std::fabs(x[i + k]);
        bool ok = v <= kBig;  // False for inf and nan.
        float f = ok ? v : 0.0f;
        hi[k] = std::max(hi[k], f);
        lo[k] = std::min(lo[k], ok ? v : lo[k]);
        sq[k] += static_cast<double>(f) * f;
        finite[k] += ok;
      }
    }
    for (; i < n; ++i) {
      float v = std::fabs(x[i]);
      if (!(v <= kBig)) continue;
      hi[0] = std::max(hi[0], v);
      lo[0] = std::min(lo[0], v);
      sq[0] += static_cast<double>(v) * v;
      ++finite[0];
    }
    for (int k = 0; k < 4; ++k) {
      s.max_abs = std::max(s.max_abs, static_cast<double>(hi[k]));
      s.min_abs = std::min(s.min_abs, static_cast<double>(lo[k]));
      sum_sq += sq[k];
      count += finite[k];
    }
  }
  if (count > 0) s.rms = std::sqrt(sum_sq / static_cast<double>(count));
  if (count == 0) s.min_abs = 0;
  return s;
}

// Root-sum-square: the rms of the sum of independent errors.
double Rss(double a, double b) { return std::sqrt(a * a + b * b); }

// Adds the rounding term of an output of `dtype` with statistics `out`.
Error Rounded(Error e, DType dtype, const Stats& out) {
  double u = UnitRoundoff(dtype);
  e.max += 2 * u * out.max_abs;
  e.rms = Rss(e.rms, u * out.rms);
  return e;
}

// The error a matmul of K products per output passes on from its operands' errors.
Error MatmulPropagation(const Error& a, const Error& b, const Stats& sa, const Stats& sb,
                        double k) {
  double worst = k * (a.max * sb.max_abs + b.max * sa.max_abs + a.max * b.max);
  double rms = std::sqrt(k) * (a.rms * sb.rms + b.rms * sa.rms + a.rms * b.rms);
  return Error{std::min(worst, kSigmas * rms), rms};
}

// Sums, over every output element o = sum_j p_j v_j of attention(q, k, v) (p: the exact
// softmax of the row's logits, in double), of the spread s = sum_j p_j |v_j - o|: the largest
// s, the sum of s^2 and the count, accumulated into `max`, `sum_sq` and `count`.
void AttentionSpread(const Array& q, const Array& k, const Array& v, bool causal, double& max,
                     double& sum_sq, double& count) {
  const int64_t b = q.shape()[0], t = q.shape()[1], heads = q.shape()[2], h = q.shape()[3];
  const int64_t s = k.shape()[1], group = heads / k.shape()[2];
  const double scale = 1 / std::sqrt(static_cast<double>(h));
  std::vector<double> p(static_cast<size_t>(s)), o(static_cast<size_t>(h));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t n = 0; n < heads; ++n) {
      const int64_t g = n / group;
      for (int64_t ti = 0; ti < t; ++ti) {
        const int64_t seen = causal ? s - t + ti + 1 : s;  // As Attention's mask.
        const float* qrow = q.data() + ((bi * t + ti) * heads + n) * h;
        auto kv_row = [&](const Array& a, int64_t j) {
          return a.data() + ((bi * s + j) * k.shape()[2] + g) * h;
        };
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < h; ++d) dot += static_cast<double>(qrow[d]) * kv_row(k, j)[d];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j < seen; ++j) sum += p[j] = std::exp(p[j] - m);
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < seen; ++j) {
          p[j] /= sum;
          for (int64_t d = 0; d < h; ++d) o[d] += p[j] * kv_row(v, j)[d];
        }
        for (int64_t d = 0; d < h; ++d) {
          double spread = 0;
          for (int64_t j = 0; j < seen; ++j) spread += p[j] * std::fabs(kv_row(v, j)[d] - o[d]);
          if (std::isnan(spread)) spread = std::numeric_limits<double>::infinity();
          max = std::max(max, spread);
          sum_sq += spread * spread;
          count += 1;
        }
      }
    }
  }
}

// Everything the bound walk knows about one value.
struct Tracked {
  Error error;
  Stats stats;
};

}  // namespace

namespace {

// What the error of a local op depends on beyond its inputs' errors and statistics.
struct OpFacts {
  // matmul, einsum: products per output; sum, mean: terms per output; softmax, norms, top_k
  // and their grads: the axis length; attention, attention_grad: the head dimension H;
  // take_grad: the ids; cross_entropy_grad: the labels.
  double k = 1;
  double norm_floor = 0;  // rms_norm, layer_norm: SmallestNormScale of the reference's x.
  size_t output = 0;      // Which output the error is for (top_k: 0 values, 1 indices).
  // matmul, einsum: the products per output the reference adds in another order, this op's
  // own k or the longer global contraction it is a block of; 0 where the reference adds the
  // same products in the same order (ReferenceOutputs' `reordered`).
  double reordered_k = 0;
  double queries = 1;  // attention_grad: the queries that read each key (T N / K).
  // attention: the largest and the rms, over outputs o = sum_j p_j v_j, of the spread
  // sum_j p_j |v_j - o| of the values a query reads about its output (AttentionSpread).
  double spread_max = std::numeric_limits<double>::infinity();
  double spread_rms = std::numeric_limits<double>::infinity();
};

// No finite bound holds: infinite in max and rms, so neither the statistical cap nor an
// rms-based estimate downstream makes it finite again.
constexpr Error kUnbounded{std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::infinity()};

// The error of unary_grad's g f'(x) from g's and x's (see ErrorBoundModel): with D1 >= |f'| and
// D2 >= |f''| over x's range widened by its error, |g~ f'(x~) - g f'(x)| <= D1 e_g +
// (|g| + e_g) D2 e_x; relu' and abs' instead jump (by 1 and 2) where x may cross 0.
Error UnaryGradError(const OpSpec& op, const Tracked& g, const Tracked& x) {
  const Error& eg = g.error;
  const Error& ex = x.error;
  const double hi = x.stats.max_abs + ex.max;  // |x| <= hi.
  const double lo = x.stats.min_abs - ex.max;  // |x| >= lo (when positive).
  double d1 = 1, d2 = 0, jump = 0;
  const std::optional<OpKind> fn = ParseOpKind(op.fn);
  switch (fn.value_or(OpKind::kAdd)) {
    case OpKind::kRelu:
    case OpKind::kAbs:
      if (!ex.exact() && x.stats.min_abs <= ex.max) jump = *fn == OpKind::kRelu ? 1 : 2;
      break;
    case OpKind::kGelu:  // Largest slopes of the tanh-approximate gelu: 1.129, 0.798.
      d1 = 1.13, d2 = 0.8;
      break;
    case OpKind::kSilu:  // 1.0998 and 1/2 (at 0).
      d1 = 1.1, d2 = 0.5;
      break;
    case OpKind::kTanh:  // 1 and 4 / (3 sqrt 3).
      d2 = 0.77;
      break;
    case OpKind::kSin:
    case OpKind::kCos:
      d2 = 1;
      break;
    case OpKind::kSquare:  // 2x and 2.
      d1 = 2 * hi, d2 = 2;
      break;
    case OpKind::kSqrt:   // 0.5 x^-0.5 and 0.25 x^-1.5 over [lo, inf).
    case OpKind::kRsqrt:  // 0.5 x^-1.5 and 0.75 x^-2.5.
      if (lo <= 0 || (!ex.exact() && x.stats.min_abs <= 2 * ex.max)) return kUnbounded;
      d1 = *fn == OpKind::kSqrt ? 0.5 / std::sqrt(lo) : 0.5 / (lo * std::sqrt(lo));
      d2 = *fn == OpKind::kSqrt ? 0.25 / (lo * std::sqrt(lo)) : 0.75 / (lo * lo * std::sqrt(lo));
      break;
    default:
      return kUnbounded;
  }
  Error e;
  if (!eg.exact()) e = Error{d1 * eg.max, d1 * eg.rms};
  if (!ex.exact()) {
    e.max += (g.stats.max_abs + eg.max) * (d2 * ex.max + jump);
    e.rms += (g.stats.rms + eg.rms) * (d2 * ex.rms + jump);
  }
  return e;
}

// The error the ops of nn_ops.h pass on (see ErrorBoundModel).
Error NnOpError(const OpSpec& op, const std::vector<const Tracked*>& in, const OpFacts& facts,
                const Stats& out, DType dtype) {
  const Error& a = in[0]->error;
  const Stats& sa = in[0]->stats;
  const double n = facts.k;
  switch (op.kind) {
    case OpKind::kArgsort:
      // Reached with inexact keys only (exact ones give exact indices): any two may swap, an
      // index off by up to the row's length.
      return Error{std::max(n - 1, 0.0), std::max(n - 1, 0.0)};
    case OpKind::kCumsum:  // Each prefix a sum of at most n terms, rounded once.
    case OpKind::kSum:
    case OpKind::kMean: {
      Error e{std::min(n * a.max, kSigmas * std::sqrt(n) * a.rms), std::sqrt(n) * a.rms};
      if (op.kind == OpKind::kMean && n > 0) e = Error{e.max / n, e.rms / n};
      return Rounded(e, dtype, out);
    }
    case OpKind::kReduceMax:
      return a;
    case OpKind::kSoftmax:
      return Rounded(Error{std::min(out.max_abs * std::expm1(2 * a.max), a.max / 2),
                           std::min(2 * out.rms, 0.5) * a.rms},
                     dtype, out);
    case OpKind::kLogSoftmax:
      return Rounded(Error{2 * a.max, 2 * a.rms}, dtype, out);
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm: {
      const bool layer = op.kind == OpKind::kLayerNorm;
      const double floor = facts.norm_floor;
      if (!(floor > 2 * a.max)) return kUnbounded;
      const double lo = floor - a.max;
      const double u_max = std::min(std::sqrt(n), (layer ? 2 : 1) * sa.max_abs / floor);
      const Error du{a.max * ((layer ? 2 : 1) + u_max) / lo, 2 * a.rms / lo};
      const Error& es = in[1]->error;
      const Stats& ss = in[1]->stats;
      return Rounded(Error{du.max * (ss.max_abs + es.max) + u_max * es.max,
                           du.rms * (ss.rms + es.rms) + es.rms},
                     dtype, out);
    }
    case OpKind::kTake:
    case OpKind::kRepeat:  // Copies of a's slices, chosen by exact ids or counts: a's error.
      if (in[1]->error.exact()) return a;
      return Error{2 * sa.max_abs + a.max, 2 * sa.rms + a.rms};
    case OpKind::kCrossEntropy:
      if (in[1]->error.exact()) return Rounded(Error{2 * a.max, 2 * a.rms}, dtype, out);
      return Rounded(Error{2 * sa.max_abs + 2 * a.max, 2 * sa.rms + 2 * a.rms}, dtype, out);
    case OpKind::kTopK:
      if (facts.output == 0) return a;
      return Error{std::max(n - 1, 0.0), std::max(n - 1, 0.0)};
    case OpKind::kOneHot:
    case OpKind::kMoeRoute:
      return Error{1, 1};     // Reached with inexact indices only: any element may flip.
    case OpKind::kRaggedDot:  // Each output is a k-term dot product, as matmul's.
      // Sizes that may be off move rows between groups: no bound holds.
      if (!in[2]->error.exact()) return kUnbounded;
      return Rounded(MatmulPropagation(a, in[1]->error, sa, in[1]->stats, n), dtype, out);
    case OpKind::kAttention: {
      const Error& eq = a;
      const Error& ek = in[1]->error;
      const Error& ev = in[2]->error;
      const Stats& sq = sa;
      const Stats& sk = in[1]->stats;
      const Stats& sv = in[2]->stats;
      const double worst =
          std::sqrt(n) * (eq.max * sk.max_abs + ek.max * sq.max_abs + eq.max * ek.max);
      const double logit_rms = eq.rms * sk.rms + ek.rms * sq.rms + eq.rms * ek.rms;
      const double logit_max = std::min(worst, kSigmas * logit_rms);
      const double u = UnitRoundoff(dtype);
      const double moved =
          logit_max > 0 ? std::min(2 * sv.max_abs, std::expm1(2 * logit_max) * facts.spread_max)
                        : 0;
      return Rounded(
          Error{moved + 2 * u * sv.max_abs + (1 + u) * ev.max,
                2 * logit_rms * std::min(sv.rms, facts.spread_rms) + u * sv.rms + ev.rms},
          dtype, out);
    }
    default:
      return kUnbounded;
  }
}

// The error the derivative ops of grad_ops.h pass on (see ErrorBoundModel). g = in[0] is the
// cotangent (M_g, e_g; ragged_dot_rhs_grad's is in[1]); first-order bounds, each derived beside
// its case.
Error GradOpError(const OpSpec& op, const std::vector<const Tracked*>& in, const OpFacts& facts,
                  const Stats& out, DType dtype) {
  const Tracked& g = *in[0];
  const Error& eg = g.error;
  const double mg = g.stats.max_abs + eg.max, rg = g.stats.rms + eg.rms;  // |g~| bounds.
  const double n = facts.k;
  // Whether input i (past g) carries an error.
  auto inexact = [&](size_t i) { return !in.at(i)->error.exact(); };
  switch (op.kind) {
    case OpKind::kFullLike:
      return Error{};  // A constant on both sides.
    case OpKind::kBroadcastInDim:
    case OpKind::kPad:
      return eg;  // Data movement.
    case OpKind::kUnaryGrad:
      return Rounded(UnaryGradError(op, g, *in[1]), dtype, out);
    case OpKind::kMaxGrad:
    case OpKind::kReduceMaxGrad: {
      // g m with m in [0, 1] (reduce_max_grad: g / count at the maxima): |g~ m~ - g m| <=
      // e_g + |g~| |m~ - m|, the mask able to flip anywhere where a or b (x) is inexact.
      Error e = eg;
      if (inexact(1) || (in.size() > 2 && inexact(2))) e = Error{e.max + mg, e.rms + rg};
      return Rounded(e, dtype, out);
    }
    case OpKind::kSoftmaxGrad: {
      // dx = y (g - sum(g y)) with y in [0, 1] summing to 1 along the axis of n: g's error
      // moves y g by e_g and the sum by e_g (a weighted mean); y's moves (g - sum) y by 2 M_g e_y
      // and the sum by n M_g e_y.
      const Error& ey = in[1]->error;
      return Rounded(Error{2 * eg.max + (2 + n) * mg * ey.max, 2 * eg.rms + (2 + n) * rg * ey.rms},
                     dtype, out);
    }
    case OpKind::kLogSoftmaxGrad: {
      // dx = g - exp(y) sum(g), exp(y) <= 1: g's error (1 + n) e_g; y's moves exp(y) by a factor
      // exp(e_y), so exp(y) sum(g) by n M_g expm1(e_y).
      const Error& ey = in[1]->error;
      return Rounded(Error{(1 + n) * eg.max + n * mg * std::expm1(ey.max),
                           (1 + n) * eg.rms + n * rg * std::expm1(ey.rms)},
                     dtype, out);
    }
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad: {
      // With r = 1 / sqrt(var + eps) <= 1 / lo (lo: the reference's smallest row scale less
      // x's error), |xhat| <= u (as the forward bound), xhat moving by du: dx = r (g s -
      // mean(g s) - xhat mean(g s xhat)) is at most r |g| |s| (2 + u); it moves by that with
      // e_g or e_s for |g| or |s|, by a relative e_x / lo through r, and by r |g| |s| du (1 + u)
      // through xhat. The second output g xhat moves by e_g u + |g| du.
      const bool layer = op.kind == OpKind::kLayerNormGrad;
      const Tracked& x = *in[1];
      const Tracked& sc = *in[2];
      const Error& ex = x.error;
      const Error& es = sc.error;
      if (!(facts.norm_floor > 2 * ex.max)) return kUnbounded;
      const double lo = facts.norm_floor - ex.max;
      const double u = std::min(std::sqrt(n), (layer ? 2 : 1) * x.stats.max_abs / facts.norm_floor);
      const Error du{ex.max * ((layer ? 2 : 1) + u) / lo, 2 * ex.rms / lo};
      if (facts.output == 1) {
        return Rounded(Error{eg.max * u + mg * du.max, eg.rms * u + rg * du.rms}, dtype, out);
      }
      const double ms = sc.stats.max_abs + es.max, rs = sc.stats.rms + es.rms;
      const Error e{(ms * eg.max + mg * es.max) * (2 + u) / lo +
                        mg * ms * ((2 + u) * ex.max / lo + du.max * (1 + u)) / lo,
                    (rs * eg.rms + rg * es.rms) * (2 + u) / lo +
                        rg * rs * ((2 + u) * ex.rms / lo + du.rms * (1 + u)) / lo};
      return Rounded(e, dtype, out);
    }
    case OpKind::kTakeGrad:
    case OpKind::kTopKGrad: {
      // Scatter-adds of g: sums of up to n (the ids) of its slices, as a sum's error (top_k's
      // indices are distinct per row: n = 1). Inexact indices may move any slice elsewhere.
      const double terms = op.kind == OpKind::kTakeGrad ? n : 1;
      if (inexact(1)) return Error{2 * terms * mg, 2 * std::sqrt(terms) * rg};
      Error e{std::min(terms * eg.max, kSigmas * std::sqrt(terms) * eg.rms),
              std::sqrt(terms) * eg.rms};
      return op.kind == OpKind::kTakeGrad ? Rounded(e, dtype, out) : e;
    }
    case OpKind::kCrossEntropyGrad: {
      // g / N (p - onehot), |p - onehot| <= 1, N = n labels: g's error over N; the logits'
      // moves p by a factor exp(2 e_x) (softmax), so by expm1(2 e_x); an inexact label moves the
      // one-hot term (2 |g| / N).
      const Error& ex = in[1]->error;
      Error e{(eg.max + mg * std::expm1(2 * ex.max)) / n,
              (eg.rms + rg * std::expm1(2 * ex.rms)) / n};
      if (inexact(2)) e = Error{e.max + 2 * mg / n, e.rms + 2 * rg / n};
      return Rounded(e, dtype, out);
    }
    case OpKind::kRaggedDotRhsGrad:  // in = [lhs, g]: a dot product over a group's rows.
      if (!in[2]->error.exact()) return kUnbounded;  // Rows may change group.
      return Rounded(MatmulPropagation(in[0]->error, in[1]->error, in[0]->stats, in[1]->stats, n),
                     dtype, out);
    case OpKind::kAttentionGrad: {
      // Logits s = q k / sqrt(H) move by e_s (the forward's bound); p = softmax(s) by a factor
      // exp(2 e_s): rho = expm1(2 e_s) of p. dp = g . v is at most H M_g M_v and moves by
      // H (e_g M_v + M_g e_v); ds = p (dp - sum(p dp)) is at most 2 p H M_g M_v and moves by
      // p E, E = 4 rho H M_g M_v + 2 e_dp. Summing p (or ds) over the keys (sum p = 1) or over
      // the Q = facts.queries queries that read a key: dq moves by (E M_k + 2 H M_g M_v e_k) /
      // sqrt(H), dk by Q (E M_q + 2 H M_g M_v e_q) / sqrt(H), dv by Q (rho M_g + e_g).
      const double h = n, q_count = facts.queries;
      const Tracked& q = *in[1];
      const Tracked& k = *in[2];
      const Tracked& v = *in[3];
      auto bound = [&](bool rms) {
        auto m = [&](const Tracked& t) {
          return rms ? t.stats.rms + t.error.rms : t.stats.max_abs + t.error.max;
        };
        auto err = [&](const Tracked& t) { return rms ? t.error.rms : t.error.max; };
        const double g_mag = rms ? rg : mg, g_err = err(g);
        const double logit = std::sqrt(h) * (err(q) * m(k) + err(k) * m(q));
        const double rho = std::min(2.0, std::expm1(2 * logit));
        const double e_dp = h * (g_err * m(v) + g_mag * err(v));
        const double big = 2 * h * g_mag * m(v);
        const double e_ds = 2 * rho * big + 2 * e_dp;
        const double spread = rms ? std::sqrt(q_count) : q_count;
        switch (facts.output) {
          case 0:
            return (e_ds * m(k) + big * err(k)) / std::sqrt(h);
          case 1:
            return spread * (e_ds * m(q) + big * err(q)) / std::sqrt(h);
          default:
            return spread * (rho * g_mag + g_err);
        }
      };
      return Rounded(Error{bound(false), bound(true)}, dtype, out);
    }
    default:
      return kUnbounded;
  }
}

// The error of local op `op`'s outputs from its inputs' (see ErrorBoundModel).
Error LocalOpError(const OpSpec& op, const std::vector<const Tracked*>& in, const OpFacts& facts,
                   const Stats& out, DType dtype) {
  const double k = facts.k;
  bool exact = true;
  for (const Tracked* t : in) exact = exact && t->error.exact();
  const bool contraction = op.kind == OpKind::kMatmul || op.kind == OpKind::kEinsum;
  if (exact && !(contraction && facts.reordered_k > 0)) return Error{};
  Error e;  // Data movement and 1-Lipschitz exact ops: the largest input error.
  for (const Tracked* t : in) {
    e.max = std::max(e.max, t->error.max);
    e.rms = std::max(e.rms, t->error.rms);
  }
  if (IsNnOp(op.kind)) return NnOpError(op, in, facts, out, dtype);
  if (op.kind == OpKind::kTakeShard) {  // A block's look-up: take's bound.
    OpSpec take = op;
    take.kind = OpKind::kTake;
    return NnOpError(take, in, facts, out, dtype);
  }
  if (IsGradOp(op.kind)) return GradOpError(op, in, facts, out, dtype);
  const Error& a = in[0]->error;
  const Stats& sa = in[0]->stats;
  switch (op.kind) {
    case OpKind::kAdd:
    case OpKind::kSub:
      if (in.size() == 2) e = Error{a.max + in[1]->error.max, Rss(a.rms, in[1]->error.rms)};
      return Rounded(e, dtype, out);
    case OpKind::kMul:
      if (op.scalar) {
        double s = std::fabs(*op.scalar);
        return Rounded(Error{s * a.max, s * a.rms}, dtype, out);
      } else {
        const Error& b = in[1]->error;
        const Stats& sb = in[1]->stats;
        return Rounded(Error{sa.max_abs * b.max + sb.max_abs * a.max + a.max * b.max,
                             sa.rms * b.rms + sb.rms * a.rms + a.rms * b.rms},
                       dtype, out);
      }
    case OpKind::kDiv: {
      if (op.scalar) {
        double s = std::fabs(*op.scalar);
        if (s == 0) return kUnbounded;
        return Rounded(Error{a.max / s, a.rms / s}, dtype, out);
      }
      const Error& b = in[1]->error;
      double m = in[1]->stats.min_abs;
      if (m <= 2 * b.max) return kUnbounded;
      return Rounded(
          Error{a.max / m + sa.max_abs * b.max / (m * m), a.rms / m + sa.rms * b.rms / (m * m)},
          dtype, out);
    }
    case OpKind::kExp: {
      double slope = out.max_abs * std::exp(a.max);
      return Rounded(Error{slope * a.max, slope * a.rms}, dtype, out);
    }
    case OpKind::kTanh:
    case OpKind::kSin:
    case OpKind::kCos:
      return Rounded(a, dtype, out);
    case OpKind::kGelu:
      return Rounded(Error{1.13 * a.max, 1.13 * a.rms}, dtype, out);
    case OpKind::kSilu:
      return Rounded(Error{1.1 * a.max, 1.1 * a.rms}, dtype, out);
    case OpKind::kSquare:
      // (x + d)^2 - x^2 = 2 x d + d^2. The rms of 2 x d is at most 2 max|x| rms(d), not 2
      // rms(x) rms(d): rounding errors grow with |x|, so the two are not independent.
      return Rounded(
          Error{2 * sa.max_abs * a.max + a.max * a.max, 2 * sa.max_abs * a.rms + a.max * a.rms},
          dtype, out);
    case OpKind::kLog:
    case OpKind::kRsqrt: {
      // |f(x + d) - f(x)| <= |d| max|f'| over [m - e, inf): log' = 1/x, rsqrt' = x^-1.5 / 2.
      double m = sa.min_abs;
      if (m <= 2 * a.max) return kUnbounded;
      double lo = m - a.max;
      double slope = op.kind == OpKind::kLog ? 1 / lo : 0.5 / (lo * std::sqrt(lo));
      return Rounded(Error{slope * a.max, slope * a.rms}, dtype, out);
    }
    case OpKind::kSqrt: {
      // |sqrt(x + d) - sqrt(x)| <= min(sqrt|d|, |d| / (2 sqrt(m - |d|))).
      double m = sa.min_abs;
      double bound = std::sqrt(a.max);
      if (m > a.max) bound = std::min(bound, a.max / (2 * std::sqrt(m - a.max)));
      return Rounded(Error{bound, std::min(bound, a.rms / (2 * std::sqrt(std::max(m, 1e-300))))},
                     dtype, out);
    }
    case OpKind::kConvert:
      // Truncating to an integer can move a value across an integer: one more unit.
      if (dtype == DType::kI32) return Error{a.max + 1, a.rms + 1};
      return Rounded(a, dtype, out);
    case OpKind::kCustomCall:
      return Error{};  // Zeros on both sides.
    case OpKind::kMatmul:
    case OpKind::kEinsum: {
      Error m = MatmulPropagation(a, in[1]->error, sa, in[1]->stats, k);
      // With inexact inputs both sides accumulate the K products in float32 on different
      // values, so the accumulations' roundings differ too: as a collective matmul's, rms
      // u32 K R_a R_b (one side's K partial sums, up to sqrt(K) R_a R_b, round by rms
      // u32 K R_a R_b / sqrt(2); two sides in quadrature). So do they from exact operands where
      // the reference adds the products in another order (reordered_k = K' > 0): BLAS blocks
      // a contraction by its operands' shapes, so a row block's sums differ from the whole
      // array's, and K' > K where the reference's contraction is the global one this op is a
      // block of, completed by a psum over G = K' / K. The reference then rounds K' partial
      // sums in one pass (rms u32 K' R_a R_b / sqrt(2)) against this side's G blocks (u32 K
      // sqrt(G / 2) R_a R_b), u32 K sqrt(G (G + 1) / 2) R_a R_b in quadrature; the psum's
      // sqrt(G) growth of its inputs' errors leaves each block u32 sqrt(K (K + K') / 2) R_a R_b,
      // which is u32 K R_a R_b when K' = K.
      if ((!m.exact() || facts.reordered_k > 0) && dtype != DType::kI32) {
        const double k_ref = std::max(k, facts.reordered_k);
        const double acc_rms = kU32 * std::sqrt(k * (k + k_ref) / 2) * sa.rms * in[1]->stats.rms;
        m.max += kSigmas * acc_rms;
        m.rms = Rss(m.rms, acc_rms);
      }
      return Rounded(m, dtype, out);
    }
    default:
      return e;
  }
}

// The error of a reducing collective (psum, pmean, psum_scatter) over a group of g.
Error ReductionError(const OpSpec& op, const Tracked& in, const Stats& out, DType out_dtype,
                     DType in_dtype, double g) {
  Error e{std::min(g * in.error.max, kSigmas * std::sqrt(g) * in.error.rms),
          std::sqrt(g) * in.error.rms};
  if (in_dtype != DType::kI32) {  // i32 sums are exact (wrapping) in any order.
    double acc_rms = kU32 * g * in.stats.rms;
    e.max += std::min(kU32 * g * g * in.stats.max_abs / 2, kSigmas * acc_rms);
    e.rms = Rss(e.rms, acc_rms);
  }
  if (op.kind == OpKind::kPmean) e = Error{e.max / g, e.rms / g};
  if (in_dtype == DType::kI32 && op.kind != OpKind::kPmean) return e;
  return Rounded(e, out_dtype, out);
}

// The error of a collective matmul over a group of g with k products per output in total.
Error CollectiveMatmulError(const Tracked& x, const Tracked& w, const Stats& out, DType dtype,
                            double g, double k) {
  Error e = MatmulPropagation(x.error, w.error, x.stats, w.stats, k);
  double u = UnitRoundoff(dtype);
  double loop_rms = std::sqrt(2 * g) * u * out.rms;
  e.max += std::min(2 * g, kSigmas * std::sqrt(2 * g)) * u * out.max_abs;
  e.rms = Rss(e.rms, loop_rms);
  if (dtype != DType::kI32) {
    double acc_rms = kU32 * k * x.stats.rms * w.stats.rms;
    e.max += kSigmas * acc_rms;
    e.rms = Rss(e.rms, acc_rms);
  }
  return Rounded(e, dtype, out);
}

// Whether position p is the first of its replicas under `spec`: at coordinate 0 along every
// mesh axis the spec does not name.
bool IsFirstReplica(const Mesh& mesh, const PartitionSpec& spec, int p) {
  const std::vector<int> coords = mesh.Coords(p);
  for (size_t a = 0; a < coords.size(); ++a) {
    bool named = false;
    for (const std::vector<std::string>& dim : spec.dims) {
      named = named || std::find(dim.begin(), dim.end(), mesh.axes()[a].name) != dim.end();
    }
    if (!named && coords[a] != 0) return false;
  }
  return true;
}

// The global array of value `name` from the blocks of the first replicas (positions at
// coordinate 0 along every mesh axis the spec leaves unsharded). Unlike AssembleOutputs it
// does not compare replicas: the simulated outputs of the same program are assembled with
// that check (Executor::Outputs), and the reference's replicas are computed identically.
Array AssembleFirstReplicas(const Sharding& sharding,
                            const std::vector<std::map<std::string, Array>>& env,
                            const std::string& name) {
  const Mesh& mesh = sharding.mesh();
  const DType dtype = env[0].at(name).dtype();
  const Shape local = sharding.LocalShape();
  const Shape& global = sharding.global_shape();
  for (int p = 0; p < mesh.size(); ++p) {
    if (IsFirstReplica(mesh, sharding.spec(), p) && !env[p].at(name).has_data()) {
      return Array::ShapeOnly(dtype, global);
    }
  }
  const int r = static_cast<int>(local.size());
  std::vector<int64_t> strides(static_cast<size_t>(r), 1);  // Row-major strides of global.
  for (int d = r - 2; d >= 0; --d) strides[d] = strides[d + 1] * global[d + 1];
  const int64_t row = r == 0 ? 1 : local[r - 1];
  const int64_t rows = row == 0 ? 0 : NumElements(local) / row;
  std::vector<float> words(static_cast<size_t>(NumElements(global)));
  for (int p = 0; p < mesh.size(); ++p) {
    if (!IsFirstReplica(mesh, sharding.spec(), p)) continue;
    const float* src = env[p].at(name).data();
    const std::vector<int64_t> offset = sharding.BlockOffset(p);
    for (int64_t k = 0; k < rows; ++k) {  // Row k of the block: its index over dims 0..r-2.
      int64_t rest = k, at = r == 0 ? 0 : offset[r - 1];
      for (int d = r - 2; d >= 0; --d) {
        at += (rest % local[d] + offset[d]) * strides[d];
        rest /= local[d];
      }
      std::memcpy(words.data() + at, src + k * row, static_cast<size_t>(row) * sizeof(float));
    }
  }
  return Array::FromWords(dtype, global, std::move(words));
}

// Whether two arrays hold the same type and bit-identical words.
bool Identical(const Array& a, const Array& b) {
  if (&a == &b) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape() || a.has_data() != b.has_data()) {
    return false;
  }
  return !a.has_data() ||
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0;
}

// The first position of `computed` whose arguments are identical to position p's, or -1.
int SameAs(const std::vector<std::vector<const Array*>>& args, const std::vector<int>& computed,
           int p) {
  for (int q : computed) {
    bool same = args[q].size() == args[p].size();
    for (size_t i = 0; same && i < args[p].size(); ++i) same = Identical(*args[q][i], *args[p][i]);
    if (same) return q;
  }
  return -1;
}

// A replica's copy of `a` where position p needs the value (keep(p)), else its type only.
template <typename Keep>
Array ReplicaOf(const Array& a, int p, const Keep& keep) {
  return keep(p) ? a : Array::ShapeOnly(a.dtype(), a.shape());
}

// a @ b for every position's arguments {a, b}, computed once per distinct pair.
// `computed` receives the positions whose product was computed (the others are copies, or
// shape-only where keep(p) says no one reads them).
template <typename Keep>
std::vector<Array> MatmulEach(const std::vector<std::vector<const Array*>>& args,
                              std::vector<int>& computed, const Keep& keep) {
  std::vector<Array> out(args.size());
  for (int p = 0; p < static_cast<int>(args.size()); ++p) {
    int same = SameAs(args, computed, p);
    if (same >= 0) {
      out[p] = ReplicaOf(out[same], p, keep);
    } else {
      out[p] = Matmul(*args[p][0], *args[p][1]);
      computed.push_back(p);
    }
  }
  return out;
}

// Statistics of value `name` over `positions` (every position when empty; replicas' copies
// add nothing to a max and leave an rms unchanged, so the distinct ones suffice).
Stats StatsOfValue(const std::vector<std::map<std::string, Array>>& env, const std::string& name,
                   const std::vector<int>& positions) {
  std::vector<const Array*> blocks;
  if (positions.empty()) {
    for (const auto& values : env) blocks.push_back(&values.at(name));
  }
  for (int p : positions) blocks.push_back(&env[p].at(name));
  return StatsOf(blocks);
}

// The products per output element of matmul or einsum `op` on operands a and b.
double ContractionLength(const OpSpec& op, const Array& a, const Array& b) {
  if (op.kind == OpKind::kMatmul) return static_cast<double>(a.shape().back());
  return static_cast<double>(EinsumContractionLength(op.spec, a, b));
}

// Sets facts.spread_max and facts.spread_rms of attention `op` from the arguments of the
// positions `distinct` (AttentionSpread); they stay infinite where an argument has no data.
void SetAttentionSpread(const OpSpec& op, const std::vector<std::vector<const Array*>>& args,
                        const std::vector<int>& distinct, OpFacts& facts) {
  double max = 0, sum_sq = 0, count = 0;
  for (int p : distinct) {
    if (!args[p][0]->has_data() || !args[p][1]->has_data() || !args[p][2]->has_data()) return;
    AttentionSpread(*args[p][0], *args[p][1], *args[p][2], op.causal, max, sum_sq, count);
  }
  facts.spread_max = max;
  facts.spread_rms = count > 0 ? std::sqrt(sum_sq / count) : 0;
}

// The OpFacts of local op `op` from every position's arguments and results (`distinct`: the
// positions whose results were computed, the others being copies).
OpFacts FactsOf(const OpSpec& op, const std::vector<std::vector<const Array*>>& args,
                const std::vector<std::vector<Array>>& results, const std::vector<int>& distinct) {
  OpFacts facts;
  if (args[0].empty()) return facts;  // axis_index.
  const Array& x = *args[0][0];
  auto axis_length = [&](int64_t axis) {
    const int64_t r = x.rank();
    return r == 0 ? 1.0 : static_cast<double>(x.shape()[static_cast<size_t>((axis % r + r) % r)]);
  };
  switch (op.kind) {
    case OpKind::kMatmul:
    case OpKind::kEinsum:
      facts.k = ContractionLength(op, x, *args[0][1]);
      break;
    case OpKind::kSum:
    case OpKind::kMean: {
      const double out = static_cast<double>(results[distinct.at(0)].at(0).size());
      facts.k = out > 0 ? static_cast<double>(x.size()) / out : 0;
      break;
    }
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kCumsum:
    case OpKind::kArgsort:
      facts.k = axis_length(op.norm_axis);
      break;
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
      facts.k = axis_length(op.norm_axis);
      facts.norm_floor = std::numeric_limits<double>::infinity();
      for (int p : distinct) {
        facts.norm_floor = std::min(facts.norm_floor, SmallestNormScale(op, *args[p][0]));
      }
      break;
    case OpKind::kTopK:
      facts.k = static_cast<double>(x.shape().back());
      break;
    case OpKind::kAttention:
      facts.k = static_cast<double>(x.shape().back());
      break;
    case OpKind::kRaggedDot:  // lhs [m, k]: k products per output.
      facts.k = static_cast<double>(x.shape().back());
      break;
    case OpKind::kRaggedDotRhsGrad:  // At most m rows (one group's) per output.
      facts.k = static_cast<double>(x.shape().front());
      break;
    case OpKind::kSoftmaxGrad:
    case OpKind::kLogSoftmaxGrad:
      facts.k = axis_length(op.norm_axis);  // g has y's shape.
      break;
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad: {
      facts.k = axis_length(op.norm_axis);
      OpSpec forward = op;  // SmallestNormScale of the forward op, with its eps default.
      forward.kind = op.kind == OpKind::kRmsNormGrad ? OpKind::kRmsNorm : OpKind::kLayerNorm;
      facts.norm_floor = std::numeric_limits<double>::infinity();
      for (int p : distinct) {
        facts.norm_floor = std::min(facts.norm_floor, SmallestNormScale(forward, *args[p][1]));
      }
      break;
    }
    case OpKind::kTakeGrad:
      facts.k = static_cast<double>(args[0][1]->size());  // The ids.
      break;
    case OpKind::kCrossEntropyGrad:
      facts.k = std::max<double>(1, static_cast<double>(args[0][2]->size()));  // The labels.
      break;
    case OpKind::kAttentionGrad: {
      const Shape& q = args[0][1]->shape();
      facts.k = static_cast<double>(q.at(3));  // H.
      // T N / K: the queries that read each key.
      facts.queries = static_cast<double>(q.at(1) * q.at(2) / args[0][2]->shape().at(2));
      break;
    }
    default:
      break;
  }
  return facts;
}

}  // namespace

std::map<std::string, Array> ReferenceOutputs(const Mesh& whole_mesh, const ProgramSpec& program,
                                              const std::string& base_dir,
                                              const std::map<std::string, Array>* inputs,
                                              std::map<std::string, double>* bounds,
                                              const ContractionLengths* reordered,
                                              ContractionLengths* lengths) {
  // With several meshes each op runs on its mesh alone: the positions of one part of the union,
  // which are contiguous. part_of: each name's mesh (-1: the whole mesh).
  const bool parts = !whole_mesh.parts().empty();
  std::map<std::string, int> part_of;
  auto part_named = [&](const std::string& mesh_name) {
    return parts ? whole_mesh.PartIndex(mesh_name) : -1;
  };
  for (const ArraySpec& spec : program.arrays) part_of[spec.name] = part_named(spec.mesh);
  for (const OpSpec& op : program.ops) {
    for (const std::string& name : op.out) part_of[name] = part_named(op.mesh);
  }
  auto mesh_of = [&](int part) -> const Mesh& {
    return part >= 0 ? whole_mesh.parts()[part] : whole_mesh;
  };
  auto offset_of = [&](int part) { return part >= 0 ? whole_mesh.PartOffset(part) : 0; };
  std::vector<std::map<std::string, Array>> all_env(whole_mesh.size());
  std::map<std::string, Tracked> tracked;  // Only when bounds are asked for.
  for (const ArraySpec& spec : program.arrays) {
    Array made;
    const Array* global = nullptr;
    if (inputs && inputs->count(spec.name) && inputs->at(spec.name).has_data()) {
      global = &inputs->at(spec.name);
    } else {
      made = MakeInitialArray(spec, /*with_data=*/true, base_dir);
      global = &made;
    }
    const int part = part_named(spec.mesh);
    const Mesh& home = mesh_of(part);
    Sharding sharding(home, spec.sharding, spec.shape);
    for (int p = 0; p < home.size(); ++p) {
      all_env[offset_of(part) + p][spec.name] = sharding.Shard(*global, p);
    }
    if (bounds) tracked[spec.name] = Tracked{Error{}, StatsOf({global})};
  }
  // The current op's mesh and its positions' values (moved out of all_env while it runs).
  const Mesh* mesh_now = &whole_mesh;
  int offset = 0;
  std::vector<std::map<std::string, Array>> env;
  // Records the error of op's outputs; `error_of` maps an output's statistics to its error.
  std::vector<int> distinct;  // Positions with distinct results of the current op (empty: all).
  auto track = [&](const OpSpec& op, auto error_of) {
    if (!bounds) return;
    for (size_t j = 0; j < op.out.size(); ++j) {
      const std::string& name = op.out[j];
      Stats s = StatsOfValue(env, name, distinct);
      Error e = error_of(s, env[0].at(name).dtype(), j);
      // The statistical cap (ErrorBoundModel): errors spread like the data, so the largest
      // is at most max(kSigmas, M/R) times their rms.
      // An unbounded error stays unbounded (inf * 0 in a propagation rule is NaN: unbounded).
      if (std::isnan(e.max) || std::isnan(e.rms)) e = kUnbounded;
      if (s.rms > 0 && std::isfinite(e.max)) {
        e.max = std::min(e.max, std::max(kSigmas, s.max_abs / s.rms) * e.rms);
      }
      tracked[name] = Tracked{e, s};
    }
  };
  // Values die after their last reader (outputs never), so the reference holds only live ones.
  std::map<std::string, size_t> last_read, last_use;
  for (size_t i = 0; i < program.ops.size(); ++i) {
    for (const std::string& name : program.ops[i].in) last_read[name] = last_use[name] = i;
  }
  // The positions whose block of an output its assembly reads (AssembleFirstReplicas), by
  // position of the output's mesh.
  std::map<std::string, std::vector<char>> assembled;
  for (const OutputSpec& o : program.outputs) {
    last_use[o.name] = program.ops.size();
    const Mesh& home = mesh_of(part_of.at(o.name));
    std::vector<char>& read = assembled[o.name];
    read.resize(static_cast<size_t>(home.size()), 0);
    for (int p = 0; p < home.size(); ++p) read[p] = read[p] || IsFirstReplica(home, o.spec, p);
  }
  // Whether position p (of the current op's mesh) needs its own copy of `name`, defined by op
  // i: a later op reads it, or the output assembly does. (Replicas of the reference's results
  // are copies.)
  int part_now = -1;  // The mesh of the op running (its index; -1: the whole mesh).
  auto needed = [&](const std::string& name, size_t i, int p) {
    auto read = last_read.find(name);
    if (read != last_read.end() && read->second > i) return true;
    auto out = assembled.find(name);
    // An output assembled on another mesh is a later binding of the name: keep this one.
    return out == assembled.end() || part_of.at(name) != part_now || out->second[p] != 0;
  };
  // An op with `where` makes its outputs only on the positions it runs at; elsewhere they are
  // zeros, as collectives see them in the simulation (the outputs computed there are dropped).
  auto zero_elsewhere = [&](const OpSpec& op) {
    if (op.where.empty()) return;
    for (int p = 0; p < static_cast<int>(env.size()); ++p) {
      if (RunsAt(op, whole_mesh, offset + p)) continue;
      for (const std::string& name : op.out) {
        Array& a = env[p][name];
        a = Array::FromValues(a.dtype(), a.shape(), std::vector<float>(a.size(), 0.0f));
      }
    }
    distinct.clear();  // Positions now differ.
  };
  std::vector<std::string> dead;
  auto free_dead = [&] {
    for (const std::string& name : dead) {
      for (auto& values : all_env) values.erase(name);
    }
    dead.clear();
  };
  // Runs op i on the current mesh's positions (env).
  auto run_op = [&](const OpSpec& op, size_t i) {
    const Mesh& mesh = *mesh_now;
    const int n = static_cast<int>(env.size());
    int group = IsCollective(op.kind) ? mesh.GroupSize(ResolveCollectiveAxes(op, mesh)) : 1;
    if (op.kind == OpKind::kAllgatherMatmul || op.kind == OpKind::kMatmulReduceScatter) {
      // By definition: x @ all_gather(w) (or all_gather(x) @ w), psum_scatter(x @ w).
      bool gather = op.kind == OpKind::kAllgatherMatmul;
      OpSpec coll = op;
      coll.kind = gather ? OpKind::kAllGather : OpKind::kPsumScatter;
      coll.tiled = true;
      coll.axis = gather ? op.axis : 0;  // allgather_matmul: the gathered operand's dimension.
      std::vector<Array> gathered;
      const double k =
          static_cast<double>(env[0].at(op.in[0]).shape().back()) *
          (!gather || (op.gather == "lhs" && op.axis == 1) ? group : 1);  // x's columns gathered.
      if (gather) {
        bool rhs = op.gather == "rhs";
        std::vector<Array> inputs;
        for (int p = 0; p < n; ++p) inputs.push_back(env[p].at(op.in[rhs ? 1 : 0]));
        gathered = ReferenceCollective(coll, mesh, inputs);
        std::vector<std::vector<const Array*>> args(n);
        for (int p = 0; p < n; ++p) {
          args[p] = rhs ? std::vector<const Array*>{&env[p].at(op.in[0]), &gathered[p]}
                        : std::vector<const Array*>{&gathered[p], &env[p].at(op.in[1])};
        }
        std::vector<Array> products =
            MatmulEach(args, distinct, [&](int p) { return needed(op.out.at(0), i, p); });
        for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(products[p]);
      } else {
        std::vector<std::vector<const Array*>> args(n);
        for (int p = 0; p < n; ++p) args[p] = {&env[p].at(op.in[0]), &env[p].at(op.in[1])};
        std::vector<Array> products = MatmulEach(args, distinct, [](int) { return true; });
        distinct.clear();  // The scattered sums differ by position.
        std::vector<Array> outs = ReferenceCollective(coll, mesh, products);
        for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      }
      zero_elsewhere(op);
      track(op, [&](const Stats& s, DType dtype, size_t) {
        return CollectiveMatmulError(tracked.at(op.in[0]), tracked.at(op.in[1]), s, dtype, group,
                                     k);
      });
      return;
    }
    if (op.kind == OpKind::kRaggedAllToAll) {
      std::vector<std::vector<Array>> inputs(n);
      for (int p = 0; p < n; ++p) {
        for (const std::string& name : op.in) inputs[p].push_back(env[p].at(name));
      }
      std::vector<Array> outs = ReferenceRaggedAllToAll(op, mesh, inputs);
      for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      zero_elsewhere(op);
      // Rows move unchanged: the result is as wrong as the worse of operand and output, unless
      // an offset or size may be off (rows would land elsewhere: no bound holds).
      track(op, [&](const Stats&, DType, size_t) {
        for (size_t k = 2; k < op.in.size(); ++k) {
          if (!tracked.at(op.in[k]).error.exact()) return kUnbounded;
        }
        const Error& a = tracked.at(op.in[0]).error;
        const Error& b = tracked.at(op.in[1]).error;
        return Error{std::max(a.max, b.max), std::max(a.rms, b.rms)};
      });
      return;
    }
    if (IsCollective(op.kind)) {
      std::vector<Array> inputs;
      for (int p = 0; p < n; ++p) inputs.push_back(env[p].at(op.in.at(0)));
      DType in_dtype = inputs[0].dtype();
      std::vector<Array> outs = ReferenceCollective(op, mesh, inputs);
      for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      zero_elsewhere(op);
      track(op, [&](const Stats& s, DType dtype, size_t) {
        if (op.kind == OpKind::kAxisIndex) return Error{};
        const Tracked& in = tracked.at(op.in.at(0));
        if (op.kind == OpKind::kPsum || op.kind == OpKind::kPmean ||
            op.kind == OpKind::kPsumScatter) {
          return ReductionError(op, in, s, dtype, in_dtype, group);
        }
        return in.error;  // Moves and exact max/min.
      });
      return;
    }
    // Every position's outputs, computed before any is stored (an output may reuse an input's
    // name). Positions whose inputs are bit-identical to an earlier one's (replicas) share its
    // result: local ops are deterministic, so this only skips repeated work.
    std::vector<std::vector<const Array*>> args(n);
    for (int p = 0; p < n; ++p) {
      for (const std::string& name : op.in) args[p].push_back(&env[p].at(name));
    }
    const bool by_position = op.kind == OpKind::kAxisIndex || op.kind == OpKind::kDynamicSlice ||
                             op.kind == OpKind::kTakeShard || op.kind == OpKind::kDynamicConcat;
    std::vector<std::vector<Array>> results(n);
    for (int p = 0; p < n; ++p) {
      int same = by_position ? -1 : SameAs(args, distinct, p);
      if (same >= 0) {
        for (size_t j = 0; j < results[same].size(); ++j) {
          const std::string& name = j < op.out.size() ? op.out[j] : op.out.back();
          results[p].push_back(
              ReplicaOf(results[same][j], p, [&](int q) { return needed(name, i, q); }));
        }
      } else {
        results[p] = ApplyLocalOp(op, args[p], mesh, p);
        distinct.push_back(p);
      }
    }
    OpFacts facts;
    if (bounds) facts = FactsOf(op, args, results, distinct);
    const bool contraction = op.kind == OpKind::kMatmul || op.kind == OpKind::kEinsum;
    if (contraction && (lengths || (bounds && reordered))) {
      const double k = ContractionLength(op, *args[0][0], *args[0][1]);
      if (lengths) (*lengths)[op.out.at(0)] = k;
      if (bounds && reordered) {
        auto global = reordered->find(op.out.at(0));
        const bool same = global != reordered->end() && global->second < 0;
        facts.reordered_k = same ? 0 : std::max(k, global == reordered->end() ? k : global->second);
      }
    }
    std::vector<const Tracked*> in;
    if (bounds) {
      for (const std::string& name : op.in) in.push_back(&tracked.at(name));
    }
    // Only inexact logits move attention's probabilities: the spread they weigh is needed
    // then alone (it costs another pass over the scores).
    if (bounds && op.kind == OpKind::kAttention &&
        !(in.at(0)->error.exact() && in.at(1)->error.exact())) {
      SetAttentionSpread(op, args, distinct, facts);
    }
    std::vector<Tracked> in_copies;  // Inputs' bounds, kept while outputs replace their names.
    for (const Tracked* t : in) in_copies.push_back(*t);
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < results[p].size() && j < op.out.size(); ++j) {
        env[p][op.out[j]] = std::move(results[p][j]);
      }
    }
    zero_elsewhere(op);
    track(op, [&](const Stats& s, DType dtype, size_t output) {
      std::vector<const Tracked*> kept;
      for (const Tracked& t : in_copies) kept.push_back(&t);
      OpFacts at = facts;
      at.output = output;
      return LocalOpError(op, kept, at, s, dtype);
    });
  };
  // Moves the values of mesh `part`'s positions into env (and back with `back`).
  auto enter = [&](int part) {
    mesh_now = &mesh_of(part);
    offset = offset_of(part);
    part_now = part;
    if (part < 0) {  // The whole mesh: every position's values at once.
      env.swap(all_env);
      return;
    }
    env.clear();
    env.resize(static_cast<size_t>(mesh_now->size()));
    for (size_t p = 0; p < env.size(); ++p) env[p] = std::move(all_env[offset + p]);
  };
  auto leave = [&] {
    if (all_env.empty()) {
      all_env.swap(env);
      return;
    }
    for (size_t p = 0; p < env.size(); ++p) all_env[offset + p] = std::move(env[p]);
    env.clear();
  };
  std::map<std::string, int> live_part;  // Each name's mesh as the program runs.
  for (const ArraySpec& spec : program.arrays) live_part[spec.name] = part_named(spec.mesh);
  for (size_t i = 0; i < program.ops.size(); ++i) {
    free_dead();
    distinct.clear();
    const OpSpec& op = program.ops[i];
    for (const std::string& name : op.in) {
      if (last_use.at(name) == i && std::find(op.out.begin(), op.out.end(), name) == op.out.end()) {
        dead.push_back(name);
      }
    }
    const int part = parts ? whole_mesh.PartIndex(op.mesh) : -1;
    if (op.kind == OpKind::kDevicePut && !parts) {
      // One mesh (the unsharded reference of a global program): the value as it is.
      for (auto& values : all_env) values[op.out.at(0)] = values.at(op.in.at(0));
      if (bounds) tracked[op.out.at(0)] = tracked.at(op.in.at(0));
    } else if (op.kind == OpKind::kDevicePut) {
      // The global array the source blocks form, cut by the destination's sharding.
      const int from = live_part.at(op.in.at(0));
      enter(from);
      std::vector<Array> blocks;
      for (auto& values : env) blocks.push_back(values.at(op.in.at(0)));
      const Shape global = GlobalShapeOf(blocks.at(0).shape(), op.in_sharding, *mesh_now);
      const Sharding in(*mesh_now, op.in_sharding, global);
      leave();
      enter(part);
      std::vector<Array> outs =
          ReferenceDevicePut(in, Sharding(*mesh_now, op.sharding, global), blocks);
      for (size_t p = 0; p < env.size(); ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      track(op, [&](const Stats&, DType, size_t) { return tracked.at(op.in.at(0)).error; });
      leave();
    } else {
      enter(part);
      run_op(op, i);
      leave();
    }
    for (const std::string& name : op.out) live_part[name] = part;
  }
  free_dead();
  if (bounds) {
    for (const OutputSpec& o : program.outputs) (*bounds)[o.name] = tracked.at(o.name).error.max;
  }
  std::map<std::string, Array> outputs;
  for (const OutputSpec& o : program.outputs) {
    enter(live_part.at(o.name));
    const Mesh& mesh = *mesh_now;
    const Array& first = env[0].at(o.name);
    Sharding sharding(mesh, o.spec, GlobalShapeOf(first.shape(), o.spec, mesh));
    outputs[o.name] = AssembleFirstReplicas(sharding, env, o.name);
    leave();
  }
  return outputs;
}

namespace {

// "nan", "inf", "-inf" or the value with 9 significant digits.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

double Epsilon(DType dtype) { return 2 * UnitRoundoff(dtype); }

}  // namespace

NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference,
                              const std::map<std::string, double>& bounds) {
  NumericsReport report;
  report.checked = true;
  double worst_ratio = -1;
  for (const auto& [name, ref] : reference) {
    const Array& got = simulated.at(name);
    if (!got.has_data() || !ref.has_data()) {
      report.checked = false;
      continue;
    }
    auto it = bounds.find(name);
    const double bound = it == bounds.end() ? 0.0 : it->second;
    ++report.outputs;
    if (std::isinf(bound)) ++report.unbounded;
    double max_err = 0;
    int64_t worst = -1;     // Element of the largest finite error.
    int64_t mismatch = -1;  // First element whose non-finite values differ.
    bool reference_finite = true;
    for (int64_t i = 0; i < ref.size(); ++i) {
      double g = got.ValueAt(i), r = ref.ValueAt(i);
      reference_finite = reference_finite && std::isfinite(r);
      if (std::isfinite(g) && std::isfinite(r)) {
        double err = std::fabs(g - r);
        if (err > max_err || worst < 0) {
          max_err = std::max(max_err, err);
          worst = i;
        }
      } else if (!(g == r || (std::isnan(g) && std::isnan(r))) && mismatch < 0) {
        mismatch = i;
      }
    }
    if (!reference_finite) ++report.nonfinite;
    report.max_abs_error = std::max(report.max_abs_error, max_err);
    // Error over bound: a non-finite mismatch ranks first, then an exceeded zero bound.
    const bool fails = mismatch >= 0 || max_err > bound;
    double ratio = bound > 0 ? max_err / bound : (max_err > 0 ? 1e300 : 0);
    if (mismatch >= 0) ratio = std::numeric_limits<double>::infinity();
    if (fails) report.passed = false;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      report.tolerance = bound;
      report.worst_output = name;
      if (fails) {
        int64_t at = mismatch >= 0 ? mismatch : worst;
        report.worst_output += " (flat index " + std::to_string(at) + ": " +
                               FormatValue(got.ValueAt(at)) + " where the reference has " +
                               FormatValue(ref.ValueAt(at)) + ")";
      }
    }
  }
  return report;
}

NumericsReport CheckNumerics(const std::map<std::string, Array>& simulated, const Mesh& mesh,
                             const ProgramSpec& program, const std::string& base_dir,
                             const std::map<std::string, Array>* inputs) {
  std::map<std::string, double> bounds;
  std::map<std::string, Array> reference =
      ReferenceOutputs(mesh, program, base_dir, inputs, &bounds);
  return CompareOutputs(simulated, reference, bounds);
}

NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference, int mesh_size,
                              int64_t reduction_length) {
  return CompareOutputs(simulated, reference, CoarseBounds(reference, mesh_size, reduction_length));
}

std::map<std::string, double> CoarseBounds(const std::map<std::string, Array>& reference,
                                           int mesh_size, int64_t reduction_length) {
  std::map<std::string, double> bounds;
  for (const auto& [name, ref] : reference) {
    if (!ref.has_data() || ref.dtype() == DType::kI32) continue;  // i32: exact.
    double scale = std::max(1.0, StatsOf({&ref}).max_abs);
    double f32_roundings = mesh_size + 1 + 4 * std::sqrt(static_cast<double>(reduction_length));
    bounds[name] = (2 * Epsilon(ref.dtype()) + f32_roundings * kU32) * scale;
  }
  return bounds;
}

int64_t LongestReduction(const ProgramSpec& program) {
  int64_t longest = 1;
  for (const ArraySpec& a : program.arrays) {
    for (int64_t d : a.shape) longest = std::max(longest, d);
  }
  return longest;
}

}  // namespace shardsim
