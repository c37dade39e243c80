// tileattn/arch/sve/set.hpp: the body of one SVE micro-kernel set, namespace
// tileattn::arch::TILEATTN_SVE_SET; TILEATTN_SVE_HAS_BF16 says whether its gemm multiplies
// bf16 pairs (svbfdot). Included by arch/sve.hpp once per copy, under the copy's target; so no
// include guard, and the headers it uses come from arch/sve.hpp.
//
// SVE's registers are sizeless types (their length is the CPU's, read at run time): they
// cannot be array elements or struct members, so arch/register_gemm.hpp's accumulator array
// does not fit, and the gemm below names its accumulators. A block of C is up to 8 rows x 2
// vectors (16 accumulators of the 32 registers); the columns' ends are predicates (whilelt),
// so no panel needs a separate masked form. No packing of B: it is read in place.
// Bits: each element of C is one fused chain over K (svmla), as generic's: the float gemm is
// generic's bit for bit at every vector length. svbfdot rounds as NEON's BFDOT
// (arch/neon/set.hpp). The row sums of exp2_shift_sum_rows are reduced by FADDV, whose order
// depends on the vector length: sums (not P) differ between vector lengths in the last bits.

namespace tileattn::arch::TILEATTN_SVE_SET {

#if TILEATTN_SVE_HAS_BF16
inline constexpr const char* name = "sve-bf16";
#else
inline constexpr const char* name = "sve";
#endif
/// With BF16, bf16 tiles are multiplied as bf16 pairs (svbfdot); without, converted to float.
inline constexpr bool bf16_dot_product = TILEATTN_SVE_HAS_BF16 != 0;

namespace detail {

/// How an operand type of the gemm is loaded, broadcast and multiplied.
template <class E>
struct Operand;

template <>
struct Operand<float> {
  static svfloat32_t load(svbool_t pg, const float* p) { return svld1_f32(pg, p); }
  static svfloat32_t broadcast(const float* p) { return svdup_n_f32(*p); }
  static svfloat32_t madd(svfloat32_t acc, svfloat32_t a, svfloat32_t b) {
    return svmla_f32_x(svptrue_b32(), acc, a, b);
  }
};

#if TILEATTN_SVE_HAS_BF16
/// bf16 pairs: one pair per 32-bit lane; svbfdot adds each lane's pair product to C.
template <>
struct Operand<bf16x2> {
  static svbfloat16_t load(svbool_t pg, const bf16x2* p) {
    return svreinterpret_bf16_u32(svld1_u32(pg, reinterpret_cast<const std::uint32_t*>(p)));
  }
  static svbfloat16_t broadcast(const bf16x2* p) {
    std::uint32_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return svreinterpret_bf16_u32(svdup_n_u32(bits));
  }
  static svfloat32_t madd(svfloat32_t acc, svbfloat16_t a, svbfloat16_t b) { return svbfdot_f32(acc, a, b); }
};
#endif

// The accumulators of one block: row r's two vectors are c<r>0 and c<r>1.
#define TILEATTN_SVE_EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/// C (Rows x up to 2 vectors, the columns in p0 and p1) (+)= A B over the whole K.
template <int Rows, bool Accumulate, bool TransA, class E>
inline void gemm_block(index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c, index_t ldc,
                       svbool_t p0, svbool_t p1) {
  using Op = Operand<E>;
  const index_t vl = static_cast<index_t>(svcntw());
#define TILEATTN_SVE_INIT(r)                                                     \
  svfloat32_t c##r##0 = svdup_n_f32(0.0f), c##r##1 = svdup_n_f32(0.0f);         \
  if constexpr (Accumulate && r < Rows) {                                        \
    c##r##0 = svld1_f32(p0, c + r * ldc);                                        \
    c##r##1 = svld1_f32(p1, c + r * ldc + vl);                                   \
  }
  TILEATTN_SVE_EACH_ROW(TILEATTN_SVE_INIT)
#undef TILEATTN_SVE_INIT
  for (index_t p = 0; p < k; ++p) {
    const E* bp = b + p * ldb;
    const auto b0 = Op::load(p0, bp), b1 = Op::load(p1, bp + vl);
#define TILEATTN_SVE_STEP(r)                                                     \
  if constexpr (r < Rows) {                                                      \
    const auto ar = Op::broadcast(TransA ? a + p * lda + r : a + r * lda + p);   \
    c##r##0 = Op::madd(c##r##0, ar, b0);                                         \
    c##r##1 = Op::madd(c##r##1, ar, b1);                                         \
  }
    TILEATTN_SVE_EACH_ROW(TILEATTN_SVE_STEP)
#undef TILEATTN_SVE_STEP
  }
#define TILEATTN_SVE_STORE(r)                                                    \
  if constexpr (r < Rows) {                                                      \
    svst1_f32(p0, c + r * ldc, c##r##0);                                         \
    svst1_f32(p1, c + r * ldc + vl, c##r##1);                                    \
  }
  TILEATTN_SVE_EACH_ROW(TILEATTN_SVE_STORE)
#undef TILEATTN_SVE_STORE
}
#undef TILEATTN_SVE_EACH_ROW

/// The last `rows` (< 8) rows of a panel: the block instantiated for that count.
template <int Rows, bool Accumulate, bool TransA, class E>
inline void gemm_row_tail(index_t rows, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
                          index_t ldc, svbool_t p0, svbool_t p1) {
  if constexpr (Rows > 0) {
    if (rows == Rows) gemm_block<Rows, Accumulate, TransA>(k, a, lda, b, ldb, c, ldc, p0, p1);
    else gemm_row_tail<Rows - 1, Accumulate, TransA>(rows, k, a, lda, b, ldb, c, ldc, p0, p1);
  }
}

/// C (M x N) (+)= A B: column panels of two vectors, each in blocks of 8 rows.
template <bool Accumulate, bool TransA, class E>
inline void sve_gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
                     index_t ldc) {
  if (m <= 0 || n <= 0) return;
  const index_t vl = static_cast<index_t>(svcntw());
  for (index_t j = 0; j < n; j += 2 * vl) {
    const svbool_t p0 = svwhilelt_b32_s64(j, n), p1 = svwhilelt_b32_s64(j + vl, n);
    index_t i = 0;
    for (; i + 8 <= m; i += 8)
      gemm_block<8, Accumulate, TransA>(k, a + (TransA ? i : i * lda), lda, b + j, ldb, c + i * ldc + j, ldc, p0, p1);
    if (i < m)
      gemm_row_tail<7, Accumulate, TransA>(m - i, k, a + (TransA ? i : i * lda), lda, b + j, ldb, c + i * ldc + j,
                                           ldc, p0, p1);
  }
}

/// 2^x per lane, as arch/register_exp2.hpp computes it (the same polynomials, clamp and
/// flush): below 2^-126 is +0, -inf gives 0, NaN stays NaN.
template <bool ForBf16 = false>
inline svfloat32_t exp2(svfloat32_t x) {
  const svbool_t all = svptrue_b32();
  const svfloat32_t low = svdup_n_f32(exp2_poly::flush_below);
  svfloat32_t y = svsel_f32(svcmplt_f32(all, x, low), low, x);  // NaN: not below, so kept
  y = svsel_f32(svcmpgt_f32(all, y, svdup_n_f32(exp2_poly::highest_input)), svdup_n_f32(exp2_poly::highest_input), y);
  const svfloat32_t n = svrintm_f32_x(all, y);
  const svfloat32_t f = svsub_f32_x(all, y, n);
  svfloat32_t p;
  if constexpr (ForBf16) {
    namespace q = exp2_poly::bf16_target;
    p = svdup_n_f32(q::c4);
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c3));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c2));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c1));
  } else {
    namespace q = exp2_poly;
    p = svdup_n_f32(q::c6);
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c5));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c4));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c3));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c2));
    p = svmad_f32_x(all, p, f, svdup_n_f32(q::c1));
  }
  p = svmad_f32_x(all, p, f, svdup_n_f32(1.0f));
  const svint32_t biased = svadd_n_s32_x(all, svcvt_s32_f32_x(all, n), 127);  // exact (NaN: p is NaN)
  const svfloat32_t scaled = svmul_f32_x(all, p, svreinterpret_f32_s32(svlsl_n_s32_x(all, biased, 23)));
  return svsel_f32(svcmplt_f32(all, x, low), svdup_n_f32(0.0f), scaled);
}

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements; A given as its K x M transpose when TransA). Any M, N,
/// K >= 0.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b, index_t ldb, float* c,
          index_t ldc) {
  detail::sve_gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}

/// The same over bf16 pairs (K counts pairs): svbfdot where the copy has BF16, else generic's.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16x2* b, index_t ldb, float* c,
          index_t ldc) {
#if TILEATTN_SVE_HAS_BF16
  detail::sve_gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
#else
  generic::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
#endif
}

/// For each of `rows` rows of x (`ld` floats apart): x[r][j] = 2^(x[r][j] * scale[r] -
/// shift[r]) in place, the product and the shift in one FMA; sums[r] = the row's sum of the
/// new values. With `pairs`, the values are also written there rounded to bf16 pairs.
[[gnu::noinline]] inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n, const float* scale,
                                                  const float* shift, float* sums, bf16x2* pairs = nullptr,
                                                  index_t ld_pairs = 0) {
  const index_t vl = static_cast<index_t>(svcntw());
  for (index_t r = 0; r < rows; ++r) {
    float* xr = x + r * ld;
    const svfloat32_t f = svdup_n_f32(scale[r]), s = svdup_n_f32(-shift[r]);
    svfloat32_t sum = svdup_n_f32(0.0f);
    for (index_t j = 0; j < n; j += vl) {
      const svbool_t pg = svwhilelt_b32_s64(j, n);
      const svfloat32_t e = detail::exp2(svmad_f32_x(pg, svld1_f32(pg, xr + j), f, s));
      svst1_f32(pg, xr + j, e);
      sum = svadd_f32_m(pg, sum, e);
    }
    sums[r] = svaddv_f32(svptrue_b32(), sum);
    if (pairs) generic::round_to_pairs(xr, pairs + r * ld_pairs, n);
  }
}

/// One row of exp2_shift_sum_rows: x[j] = 2^(x[j] * scale - shift); returns the sum.
inline float exp2_shift_sum(float* x, index_t n, float scale, float shift) {
  float sum = 0.0f;
  exp2_shift_sum_rows(x, n, 1, n, &scale, &shift, &sum);
  return sum;
}

/// max(x[0..n)), -inf for n == 0. NaN entries are ignored, as in generic.
inline float row_max(const float* x, index_t n) {
  const index_t vl = static_cast<index_t>(svcntw());
  svfloat32_t m = svdup_n_f32(-std::numeric_limits<float>::infinity());
  for (index_t j = 0; j < n; j += vl) {
    const svbool_t pg = svwhilelt_b32_s64(j, n);
    const svfloat32_t v = svld1_f32(pg, x + j);
    m = svsel_f32(svcmpgt_f32(pg, v, m), v, m);  // NaN is never greater: ignored
  }
  return svmaxv_f32(svptrue_b32(), m);
}

/// x[j] *= factor.
inline void scale(float* x, index_t n, float factor) {
  const index_t vl = static_cast<index_t>(svcntw());
  for (index_t j = 0; j < n; j += vl) {
    const svbool_t pg = svwhilelt_b32_s64(j, n);
    svst1_f32(pg, x + j, svmul_n_f32_x(pg, svld1_f32(pg, x + j), factor));
  }
}

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return svlastb_f32(svptrue_b32(), detail::exp2(svdup_n_f32(x))); }

/// generic::mul_add for this target: fused, as the gemm's svmla.
inline float mul_add(float a, float b, float c) { return std::fma(a, b, c); }

// The rest is NEON's (arch/neon.hpp's baseline copy): the conversions, the transpose, the
// finite checks, and (through it) generic's in-place products and pair layouts.
using neon::add_alibi_bias;
using neon::all_finite;
using neon::transpose;
using neon::to_float;
using neon::from_float;
using neon::gemm_nt_rows;
using neon::gemm_rows;
using neon::touch_rows;
using neon::in_place_pairs;
using neon::in_place_pairs_min_rows;
using neon::gemm_nt_rows_pairs;
using neon::gemm_rows_pairs;
using neon::interleave_pairs;
using neon::interleave_rounded;
using neon::round_to_pairs;
using neon::dequantize_blocks;
using neon::dropout_keep_bits;
using neon::apply_keep_bits;

/// B operands read in place (arch/prepared_pairs.hpp): one slab of all rows.
TILEATTN_PAIRS_READ_IN_PLACE

}  // namespace tileattn::arch::TILEATTN_SVE_SET
