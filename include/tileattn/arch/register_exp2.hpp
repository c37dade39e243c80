// tileattn/arch/register_exp2.hpp: 2^x on a register of floats, written once for every SIMD
// set over its VecTraits; arch/exp2.hpp gives the method, the polynomials and the accuracy.
//
// Not a header on its own: arch/avx2.hpp and arch/avx512/softmax_rows.hpp include it in the
// set's namespace `detail`, under its target, after VecTraits (arch/register_gemm.hpp says
// why). No include guard, no includes.
//
// Besides register_gemm.hpp's and register_rows.hpp's, a VecTraits V gives here: min(a, b),
// sub(a, b), fmadd(a, b, c) (a b + c, one rounding), round_nearest(reg) and
// times_power_of_two(p, n) (p * 2^n for integral n in [-151, 128], subnormal results rounded
// once).

/// 2^x on V::lanes lanes. ForBf16: the degree-4 polynomial, for values rounded to bf16 next
/// (exp2_poly::bf16_target); else the degree-6 one.
template <bool ForBf16 = false>
inline typename VecTraits::reg exp2(typename VecTraits::reg x) {
  using V = VecTraits;
  namespace c = exp2_poly;
  x = V::max(V::set1(c::lowest_input), x);  // max(lo, NaN) keeps the NaN
  x = V::min(V::set1(c::highest_input), x);
  const typename V::reg n = V::round_nearest(x);
  const typename V::reg f = V::sub(x, n);  // exact, in [-1/2, 1/2]
  typename V::reg p;
  if constexpr (ForBf16) {
    namespace b = exp2_poly::bf16_target;
    p = V::set1(b::c4);
    p = V::fmadd(p, f, V::set1(b::c3));
    p = V::fmadd(p, f, V::set1(b::c2));
    p = V::fmadd(p, f, V::set1(b::c1));
  } else {
    p = V::set1(c::c6);
    p = V::fmadd(p, f, V::set1(c::c5));
    p = V::fmadd(p, f, V::set1(c::c4));
    p = V::fmadd(p, f, V::set1(c::c3));
    p = V::fmadd(p, f, V::set1(c::c2));
    p = V::fmadd(p, f, V::set1(c::c1));
  }
  p = V::fmadd(p, f, V::set1(1.0f));
  return V::times_power_of_two(p, n);  // NaN lanes: p is NaN, so NaN out
}
