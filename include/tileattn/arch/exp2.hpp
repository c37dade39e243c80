// tileattn/arch/exp2.hpp: the polynomial behind every SIMD 2^x, its coefficients and its
// stated accuracy, shared by the AVX2 and AVX-512 micro-kernels.
//
// Method. 2^x = 2^n * 2^f with n = round(x) and f = x - n in [-1/2, 1/2]; f is exact in
// float for |x| < 2^23. 2^f comes from a degree-6 polynomial whose constant term is exactly
// 1 (so 2^0 == 1: the row maximum always gets probability exactly 1), with coefficients
// fitted by a relative-error Remez exchange on [-1/2, 1/2]: approximation error 3.9e-9,
// far below float rounding, so what remains is the rounding of the Horner FMAs.
// 2^n is applied in two exact power-of-two factors (or one vscalefps), so results in the
// subnormal range [2^-149, 2^-126) are rounded once, as a correctly rounded exp2 would be.
//
// Stated accuracy (checked by tests/arch against std::exp2 in double over [-150, 0]):
//   max relative error <= 1.2e-7 (1 ulp of 1.0) for 2^x >= 2^-126 (normal results);
//   measured: 7.6e-8 on AVX2 and AVX-512 over 1.3 million points of [-150, 0];
//   subnormal results within 1 ulp of the subnormal spacing (2^-149);
//   x <= -151 (including -inf) gives exactly +0; NaN stays NaN.
// Inputs above 0 (the online softmax never asks for them) keep the same relative accuracy
// up to 2^x < 2^128; x >= 128 (including +inf) gives +inf.
#pragma once

namespace tileattn::arch::exp2_poly {

/// 2^f ~= 1 + f (c1 + f (c2 + f (c3 + f (c4 + f (c5 + f c6))))) for f in [-1/2, 1/2].
inline constexpr float c1 = 6.9314722524e-01f;
inline constexpr float c2 = 2.4022650870e-01f;
inline constexpr float c3 = 5.5502975653e-02f;
inline constexpr float c4 = 9.6180583163e-03f;
inline constexpr float c5 = 1.3409920544e-03f;
inline constexpr float c6 = 1.5461835406e-04f;

/// A degree-4 fit for results that are rounded to bf16 right away (P in the bf16 dot-product
/// path): max relative error 2.8e-6 on [-1/2, 1/2] (same fit, relative-error weighted),
/// 1/1400 of bf16's half-ulp, for two FMAs less per vector.
namespace bf16_target {
inline constexpr float c1 = 6.931241751e-01f;
inline constexpr float c2 = 2.402409911e-01f;
inline constexpr float c3 = 5.590642989e-02f;
inline constexpr float c4 = 9.582852945e-03f;
}  // namespace bf16_target

/// Inputs are clamped to [lowest_input, highest_input] before the reduction: 2^-151
/// rounds to +0 and 2^128 overflows to +inf, and the clamp turns -inf and +inf into finite
/// values, so f = x - n never becomes inf - inf.
inline constexpr float lowest_input = -151.0f;
inline constexpr float highest_input = 128.0f;

}  // namespace tileattn::arch::exp2_poly
