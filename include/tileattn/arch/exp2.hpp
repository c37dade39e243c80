// tileattn/arch/exp2.hpp: the polynomials behind every SIMD 2^x, their coefficients and their
// stated accuracy, shared by the AVX2 and AVX-512 micro-kernels.
//
// Method. 2^x = 2^n * 2^f with n = floor(x) and f = x - n in [0, 1]. 2^f comes from a
// polynomial whose constant term is exactly 1 (so 2^0 == 1: the row maximum always gets
// probability exactly 1), with coefficients fitted for the least maximum relative error on
// [0, 1] (a linear program over 40001 points); 2^n is applied in one exact step (vscalefps,
// which takes floor(x) itself; AVX2: a multiply by 2^n built in the exponent bits). On AVX-512
// with DQ, f comes from one vreduceps and 2^n from vscalefps on x itself: four instructions
// fewer than a rounding, a subtraction and two clamps, and -inf, +inf and NaN come out as 0,
// +inf and NaN with no clamp. Elsewhere x is clamped to [flush_below, highest_input] first,
// so that f = x - n never becomes inf - inf. f is exact but for x in (-1, 0), where x + 1 is
// rounded (2e-8 of relative error at most).
//
// Results below 2^-126 (x < flush_below) are +0: no subnormal float is ever made, in P or in
// a running-max correction. On the Xeon each one costs a microcode assist where it is made or
// multiplied (rows whose scores spread over more than 126 in log2 units ran 18x slower in
// fp32, 4.6x in bf16); bf16 P flushed them already (vcvtne2ps2bf16). What is lost is below
// 2^-126 of the row's largest probability (which is 1), so it shows only where a value
// outweighs the others by 2^100 or more.
//
// Stated accuracy (checked by tests/arch against std::exp2 in double over [-150, 0]):
//   max relative error <= 1.2e-7 (1 ulp of 1.0) for x >= -126 (normal results);
//   measured: 8.3e-8 over every float of [-2, 0) (AVX-512), approximation error 2.0e-9;
//   x < -126 (including -inf) gives exactly +0; NaN stays NaN.
// Inputs above 0 (the online softmax never asks for them) keep the same relative accuracy
// up to 2^x < 2^128; x >= 128 (including +inf) gives +inf.
#pragma once

namespace tileattn::arch::exp2_poly {

/// 2^f ~= 1 + f (c1 + f (c2 + f (c3 + f (c4 + f (c5 + f c6))))) for f in [0, 1].
inline constexpr float c1 = 6.9314704444e-01f;
inline constexpr float c2 = 2.4022930555e-01f;
inline constexpr float c3 = 5.5485280642e-02f;
inline constexpr float c4 = 9.6754515130e-03f;
inline constexpr float c5 = 1.2467846998e-03f;
inline constexpr float c6 = 2.1612912892e-04f;

/// For results that are rounded to bf16 right away (P in the bf16 dot-product paths): a
/// degree-4 fit, max relative error 3.0e-6 on [0, 1] (measured over every float of [-2, 0)),
/// 1/650 of bf16's half-ulp, for two FMAs less per vector than the float fit. (Degree 3, at
/// 8.6e-5, saves one more FMA, 0.5% of the forward on Zen 5, but the row sums carry its error
/// into the float LSE: 4e-5 off where the tests allow 2e-5.)
namespace bf16_target {
inline constexpr float c1 = 6.9304484490e-01f;
inline constexpr float c2 = 2.4128020475e-01f;
inline constexpr float c3 = 5.2242474224e-02f;
inline constexpr float c4 = 1.3426684271e-02f;
}  // namespace bf16_target

/// x below this gives +0 (NaN stays NaN): the results below 2^-126 (file comment). Where x
/// is clamped before the reduction (AVX2, AVX-512 without DQ), it is clamped to
/// [flush_below, highest_input]: the clamp turns -inf and +inf into finite values (the
/// flushed lanes are zeroed by x itself), no lane makes a subnormal, and 2^128 overflows to
/// +inf.
inline constexpr float flush_below = -126.0f;
inline constexpr float highest_input = 128.0f;

}  // namespace tileattn::arch::exp2_poly
