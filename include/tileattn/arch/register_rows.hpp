// tileattn/arch/register_rows.hpp: the softmax's plain row operations (row max, scale, the
// one-row exponential with its sum) written once for every SIMD set over its VecTraits.
//
// Not a header on its own: arch/avx2.hpp and arch/avx512/softmax_rows.hpp include it at the
// set's namespace scope, under its target, after detail::VecTraits and the set's
// exp2_shift_sum_rows (arch/register_gemm.hpp says why). No include guard, no includes.
//
// Besides register_gemm.hpp's, a VecTraits V gives here: set1(float), max(a, b) (the second
// operand where the first is NaN, as maxps), mul(a, b), load_or(p, mask, fill) (fill in the
// lanes off the mask) and reduce_max(reg).

/// max(x[0..n)), -inf for n == 0. NaN entries are ignored, as in generic. Two accumulators
/// over pairs of registers, the tail one register at a time into the first.
inline float row_max(const float* x, index_t n) {
  using V = detail::VecTraits;
  constexpr index_t lanes = V::lanes;
  const typename V::reg lowest = V::set1(-std::numeric_limits<float>::infinity());
  typename V::reg m0 = lowest, m1 = lowest;
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    m0 = V::max(V::load(x + j), m0);  // max(NaN, m) keeps m
    m1 = V::max(V::load(x + j + lanes), m1);
  }
  for (; j < n; j += lanes) m0 = V::max(V::load_or(x + j, V::first_lanes(n - j < lanes ? n - j : lanes), lowest), m0);
  return V::reduce_max(V::max(m0, m1));
}

/// x[j] *= factor.
inline void scale(float* x, index_t n, float factor) {
  using V = detail::VecTraits;
  const typename V::reg f = V::set1(factor);
  index_t j = 0;
  for (; j + V::lanes <= n; j += V::lanes) V::store(x + j, V::mul(V::load(x + j), f));
  if (j < n) {
    const typename V::mask mask = V::first_lanes(n - j);
    V::store(x + j, mask, V::mul(V::load(x + j, mask), f));
  }
}

/// One row of exp2_shift_sum_rows: x[j] = 2^(x[j] * scale - shift); returns the sum.
inline float exp2_shift_sum(float* x, index_t n, float scale, float shift) {
  float sum = 0.0f;
  exp2_shift_sum_rows(x, n, 1, n, &scale, &shift, &sum);
  return sum;
}
