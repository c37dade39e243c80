// tileattn/arch/register_exp2.hpp: 2^x on a register of floats, written once for every SIMD
// set over its VecTraits; arch/exp2.hpp gives the method, the polynomials and the accuracy.
//
// Not a header on its own: arch/avx2.hpp and arch/avx512/softmax_rows.hpp include it in the
// set's namespace `detail`, under its target, after VecTraits (arch/register_gemm.hpp says
// why). No include guard, no includes.
//
// Besides register_gemm.hpp's and register_rows.hpp's, a VecTraits V gives here: fmadd(a,
// b, c) (a b + c, one rounding); split_floor(x) -> {f, e}, f = x - floor(x) in [0, 1] and e
// what times_two_to_floor_normal takes for x; and times_two_to_floor_normal(p, e, x) =
// p * 2^floor(x) for x >= -126 (a normal float, p being in [1, 2]), +0 below (-inf included),
// inf for x = +inf, NaN for NaN.

/// 2^x on V::lanes lanes: results below 2^-126 are +0 (exp2_poly::flush_below says why).
/// ForBf16: the degree-4 polynomial, for values rounded to bf16 next
/// (exp2_poly::bf16_target); else the degree-6 one.
template <bool ForBf16 = false>
inline typename VecTraits::reg exp2(typename VecTraits::reg x) {
  using V = VecTraits;
  const auto [f, e] = V::split_floor(x);
  typename V::reg p;
  if constexpr (ForBf16) {
    namespace b = exp2_poly::bf16_target;
    p = V::set1(b::c4);
    p = V::fmadd(p, f, V::set1(b::c3));
    p = V::fmadd(p, f, V::set1(b::c2));
    p = V::fmadd(p, f, V::set1(b::c1));
  } else {
    namespace c = exp2_poly;
    p = V::set1(c::c6);
    p = V::fmadd(p, f, V::set1(c::c5));
    p = V::fmadd(p, f, V::set1(c::c4));
    p = V::fmadd(p, f, V::set1(c::c3));
    p = V::fmadd(p, f, V::set1(c::c2));
    p = V::fmadd(p, f, V::set1(c::c1));
  }
  p = V::fmadd(p, f, V::set1(1.0f));
  return V::times_two_to_floor_normal(p, e, x);  // NaN lanes: p is NaN, so NaN out
}
