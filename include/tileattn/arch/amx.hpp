// tileattn/arch/amx.hpp: Intel AMX (TMUL) micro-kernel for the bf16 pair gemm, and
// arch::amx, the AVX-512 set whose bf16 pair gemm runs on AMX tiles where the process may
// use them (arch/amx_support.hpp) and on vdpbf16ps otherwise.
//
// Compiled wherever the target has AVX-512 BF16 (the fallback) on x86-64 Linux, with GCC or
// Clang: the tile code carries its own target attribute (amx-tile, amx-bf16), so a program
// built once, say with -march=znver4 or x86-64-v4 plus -mavx512bf16, runs AMX on a Xeon that
// has it and vdpbf16ps elsewhere; no -mamx flag is needed. TILEATTN_NO_AMX (a macro) leaves
// it out at compile time; the environment variable of the same name turns it off at run time.
//
// The layouts are the ones the kernels already pack for vdpbf16ps, which are AMX's: an A
// operand row holds pairs along K (16 pairs, 64 bytes, per tile row), a B operand row holds
// one pair of K rows interleaved for every column (VNNI layout). So tiles load straight
// from the SRAM tiles with tileloadd at the tile's leading dimension; when C has
// pack_min_rows rows or more, B is first copied into whole 16 x 16 tiles (1 KiB each,
// contiguous), which measured 1.2-1.5x on the forward's shapes.
//
// Blocking: C in blocks of 32 x 32 floats, four 16 x 16 accumulator tiles (tmm0-3), fed per
// step of 16 pairs of K by two A tiles (tmm4-5) and two B tiles (tmm6-7): 4 loads for 4
// tdpbf16ps, each load just before the first product that reads it. Tiles are always 16
// rows x 64 bytes (one configuration, loaded per call and released after, so code between
// calls, another library's included, may use tiles its own way); a block edge (rows,
// columns or pairs of K short of 16) goes through a zero-padded 16 x 16 copy, so nothing
// past the operands is read and nothing past C is written. K is taken 256 pairs at a time;
// with TransA (A given as its K x M transpose), each 32-row panel of A is transposed into
// a buffer first.
//
// A decode step's products with K and V rows read in place (gemm_nt_rows_pairs,
// gemm_rows_pairs): S^T = K Q^T with each A tile 16 key rows loaded where they lie (16 keys
// of a page are evenly spaced; otherwise copied) against Q^T's tiles, and O += P V with V's
// rows interleaved into pairs in a buffer. Used from 8 query rows per K/V group
// (in_place_pairs_min_rows says why).
//
// Prepared operands (arch/prepared_pairs.hpp): the forward's panels pack a key tile's K^T and
// V into whole tiles once (prepare_pairs) and multiply them a 64-row slab at a time
// (gemm_prepared: the same blocks and bits as gemm), with one tile configuration for a work
// item's products (begin_products / end_products; sessions nest).
//
// Sums. tdpbf16ps multiplies bf16 exactly and sums in fp32, flushing subnormal bf16 inputs
// and results to zero as vdpbf16ps does, but its rounding points are its own (it matches
// neither rounding per product, nor per pair, nor per 16 pairs: tests/arch/amx_kernels_test),
// so the two paths agree to fp32 rounding, not bitwise, and a sum's bits depend on where a
// tiling splits it. A process uses one path for every call (the check is made once), and
// the kernels split inner dimensions only on a fixed 32-value grid
// (kernels::sum_group_values), so results are bitwise reproducible across thread counts.
#pragma once

#include "tileattn/arch/amx_support.hpp"
#include "tileattn/arch/avx512.hpp"
#include "tileattn/arch/isa.hpp"
#include "tileattn/arch/prepared_pairs.hpp"

#if ((defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)) || \
     TILEATTN_ARCH_X86_DISPATCH) &&                                                                            \
    defined(TILEATTN_AMX_DETECTION) && !defined(TILEATTN_NO_AMX) &&                                       \
    (!defined(TILEATTN_BF16_DOT_PRODUCT) || TILEATTN_BF16_DOT_PRODUCT != 0)
#define TILEATTN_HAS_AMX_KERNELS 1

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/types.hpp"

#if defined(TILEATTN_AMX_EMULATE)
#include <bit>
#include <cstring>
#define TILEATTN_AMX_TARGET
#elif TILEATTN_ARCH_X86_DISPATCH  // the whole feature list: the target pragma's and AMX's
#define TILEATTN_AMX_TARGET __attribute__((target(TILEATTN_AMX_FEATURES)))
#else
#define TILEATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#endif

// A dispatched build (arch/isa.hpp) compiles the set for x86-64-v4 plus AVX-512 BF16, as arch::avx512.
#if TILEATTN_ARCH_X86_DISPATCH
TILEATTN_TARGET_BEGIN(TILEATTN_AVX512_BF16_FEATURES)
#endif

namespace tileattn::arch::amx {

inline constexpr const char* name = "avx512+amx";
/// bf16 tiles are multiplied as pairs: on AMX tiles where available, else on vdpbf16ps.
inline constexpr bool bf16_dot_product = true;

using namespace avx512;  // everything but gemm is AVX-512's

namespace detail {
inline constexpr index_t dim = 16;  // tile rows, and 32-bit elements per tile row (64 bytes)

/// Palette 1, eight tiles of 16 rows x 64 bytes: tmm0-3 C, tmm4-5 A, tmm6-7 B.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64);

inline __mmask16 lanes_mask(index_t n) { return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u); }

/// buf (16 x 16 32-bit values, 64-byte rows) = the rows x cols block at src (ld elements
/// between rows), zeros elsewhere. Masked loads: nothing outside the block is read.
inline void pad_block(const void* src, index_t ld, index_t rows, index_t cols, void* buf) {
  const __mmask16 m = lanes_mask(cols);
  const auto* s = static_cast<const std::uint32_t*>(src);
  auto* d = static_cast<std::uint32_t*>(buf);
  for (index_t r = 0; r < dim; ++r)
    _mm512_store_si512(d + dim * r, r < rows ? _mm512_maskz_loadu_epi32(m, s + r * ld) : _mm512_setzero_si512());
}

/// dst's rows x cols block (ld floats between rows) = the same block of buf.
inline void unpad_block(const float* buf, index_t rows, index_t cols, float* dst, index_t ld) {
  const __mmask16 m = lanes_mask(cols);
  for (index_t r = 0; r < rows; ++r) _mm512_mask_storeu_ps(dst + r * ld, m, _mm512_load_ps(buf + dim * r));
}

#if defined(TILEATTN_AMX_EMULATE)
// Tests only: the eight tiles and tdpbf16ps emulated in plain C++, so the blocking, edge and
// transpose logic runs on machines without AMX. The emulated instruction adds its 32 products
// (exact in double) to the accumulator with one rounding, subnormal bf16 inputs read as zero:
// not the hardware's bits (which round neither so nor per product), but, like the hardware,
// sensitive to where a tiling splits a sum, so tests of bitwise reproducibility catch splits
// that fall off the 16-pair grid (kernels::sum_group_values).
struct EmulatedTiles {
  std::uint32_t t[8][dim][dim];
};
inline EmulatedTiles& emulated_tiles() {
  thread_local EmulatedTiles tiles;
  return tiles;
}
template <int T>
inline void tile_load(const void* p, index_t stride_bytes) {
  for (index_t r = 0; r < dim; ++r)
    std::memcpy(emulated_tiles().t[T][r], static_cast<const char*>(p) + r * stride_bytes, 4 * dim);
}
template <int T>
inline void tile_store(void* p, index_t stride_bytes) {
  for (index_t r = 0; r < dim; ++r)
    std::memcpy(static_cast<char*>(p) + r * stride_bytes, emulated_tiles().t[T][r], 4 * dim);
}
template <int T>
inline void tile_zero() {
  std::memset(emulated_tiles().t[T], 0, sizeof(emulated_tiles().t[T]));
}
inline float emulated_bf16(std::uint32_t bits16) {
  const std::uint32_t x = (bits16 & 0x7f80u) == 0 ? bits16 & 0x8000u : bits16;  // DAZ
  return std::bit_cast<float>(x << 16);
}
/// Tile C += tile A times tile B.
template <int C, int A, int B>
inline void tile_dot_into() {
  auto& t = emulated_tiles().t;
  for (index_t m = 0; m < dim; ++m)
    for (index_t n = 0; n < dim; ++n) {
      double sum = std::bit_cast<float>(t[C][m][n]);
      for (index_t k = 0; k < dim; ++k) {
        const std::uint32_t a = t[A][m][k], b = t[B][k][n];
        sum += double(emulated_bf16(a & 0xffffu)) * emulated_bf16(b & 0xffffu);
        sum += double(emulated_bf16(a >> 16)) * emulated_bf16(b >> 16);
      }
      t[C][m][n] = std::bit_cast<std::uint32_t>(static_cast<float>(sum));
    }
}
template <int I, int J>
inline void tile_dot() {
  tile_dot_into<2 * I + J, 4 + I, 6 + J>();
}
#else
// Tile numbers must be literals in the intrinsics: one branch per tile, chosen at compile time.
// GCC's tileloadd asm names no memory operand, so without the barrier the compiler may sink
// or drop the stores that just filled an edge buffer (it cannot see the load read them);
// Clang's builtins say so themselves. tilestored's asm clobbers memory in both.
template <int T>
TILEATTN_AMX_TARGET inline void tile_load(const void* p, index_t stride_bytes) {
  __asm__ __volatile__("" ::: "memory");
  if constexpr (T == 0) _tile_loadd(0, p, stride_bytes);
  else if constexpr (T == 1) _tile_loadd(1, p, stride_bytes);
  else if constexpr (T == 2) _tile_loadd(2, p, stride_bytes);
  else if constexpr (T == 3) _tile_loadd(3, p, stride_bytes);
  else if constexpr (T == 4) _tile_loadd(4, p, stride_bytes);
  else if constexpr (T == 5) _tile_loadd(5, p, stride_bytes);
  else if constexpr (T == 6) _tile_loadd(6, p, stride_bytes);
  else _tile_loadd(7, p, stride_bytes);
}
template <int T>
TILEATTN_AMX_TARGET inline void tile_store(void* p, index_t stride_bytes) {
  if constexpr (T == 0) _tile_stored(0, p, stride_bytes);
  else if constexpr (T == 1) _tile_stored(1, p, stride_bytes);
  else if constexpr (T == 2) _tile_stored(2, p, stride_bytes);
  else _tile_stored(3, p, stride_bytes);
}
template <int T>
TILEATTN_AMX_TARGET inline void tile_zero() {
  if constexpr (T == 0) _tile_zero(0);
  else if constexpr (T == 1) _tile_zero(1);
  else if constexpr (T == 2) _tile_zero(2);
  else _tile_zero(3);
}
/// C tile 2 I + J += A tile 4 + I times B tile 6 + J.
template <int I, int J>
TILEATTN_AMX_TARGET inline void tile_dot() {
  if constexpr (I == 0 && J == 0) _tile_dpbf16ps(0, 4, 6);
  else if constexpr (I == 0 && J == 1) _tile_dpbf16ps(1, 4, 7);
  else if constexpr (I == 1 && J == 0) _tile_dpbf16ps(2, 5, 6);
  else _tile_dpbf16ps(3, 5, 7);
}
/// Tile C += tile A times tile B, for the resident-A schedule's tiles (scores_a_resident):
/// C 0 or 1, A 4 to 7 (a step of K each), B 2 for A 4 and 6, 3 for A 5 and 7.
template <int C, int A, int B>
TILEATTN_AMX_TARGET inline void tile_dot_into() {
  static_assert((C == 0 || C == 1) && A >= 4 && A <= 7 && B == 2 + A % 2);
  if constexpr (C == 0 && A == 4) _tile_dpbf16ps(0, 4, 2);
  else if constexpr (C == 0 && A == 5) _tile_dpbf16ps(0, 5, 3);
  else if constexpr (C == 0 && A == 6) _tile_dpbf16ps(0, 6, 2);
  else if constexpr (C == 0) _tile_dpbf16ps(0, 7, 3);
  else if constexpr (A == 4) _tile_dpbf16ps(1, 4, 2);
  else if constexpr (A == 5) _tile_dpbf16ps(1, 5, 3);
  else if constexpr (A == 6) _tile_dpbf16ps(1, 6, 2);
  else _tile_dpbf16ps(1, 7, 3);
}

#endif  // TILEATTN_AMX_EMULATE

/// Stack copies for the block edges.
struct alignas(64) EdgeBuffers {
  float c[4][dim * dim];
  std::uint32_t a[2][dim * dim];
  std::uint32_t b[2][dim * dim];
};

/// Where one C tile of a block is: its rows and columns in use (16 each, or fewer at an edge).
struct CTile {
  float* at;
  index_t rows, cols;
  bool full() const { return rows == dim && cols == dim; }
};

template <int I, int J>
TILEATTN_AMX_TARGET inline void c_begin(const CTile& t, index_t ldc, bool accumulate, EdgeBuffers& buf) {
  if (!accumulate) {
    tile_zero<2 * I + J>();
  } else if (t.full()) {
    tile_load<2 * I + J>(t.at, ldc * 4);
  } else {
    pad_block(t.at, ldc, t.rows, t.cols, buf.c[2 * I + J]);
    tile_load<2 * I + J>(buf.c[2 * I + J], dim * 4);
  }
}

template <int I, int J>
TILEATTN_AMX_TARGET inline void c_end(const CTile& t, index_t ldc, EdgeBuffers& buf) {
  if (t.full()) {
    tile_store<2 * I + J>(t.at, ldc * 4);
  } else {
    tile_store<2 * I + J>(buf.c[2 * I + J], dim * 4);
    unpad_block(buf.c[2 * I + J], t.rows, t.cols, t.at, ldc);
  }
}

/// Loads A tile 4 + I: rows [16 I, 16 I + rows_i) of a, pairs [0, kp).
template <int I>
TILEATTN_AMX_TARGET inline void a_load(const bf16x2* a, index_t lda, index_t rows_i, index_t kp, EdgeBuffers& buf) {
  if (rows_i == dim && kp == dim) {
    tile_load<4 + I>(a, lda * 4);
  } else {
    pad_block(a, lda, rows_i, kp, buf.a[I]);
    tile_load<4 + I>(buf.a[I], dim * 4);
  }
}

/// Where B's tiles come from: B itself (element (p, j) at data[p * ld + j]), or a packed copy
/// (packed_tiles > 0) whose 16 x 16 tile for pairs [16 s, 16 s + 16) and columns
/// [16 t, 16 t + 16) lies whole and zero-padded at data + (s * packed_tiles + t) * 256.
struct BOperand {
  const std::uint32_t* data;
  index_t ld;
  index_t packed_tiles = 0;  // column tiles per step of K in the packed copy; 0: not packed
};

/// Loads B tile 6 + J: pair rows [p, p + kp) of b, columns [j, j + cols_j).
template <int J>
TILEATTN_AMX_TARGET inline void b_load(const BOperand& b, index_t p, index_t j, index_t kp, index_t cols_j,
                                       EdgeBuffers& buf) {
  if (b.packed_tiles > 0) {
    tile_load<6 + J>(b.data + (p / dim * b.packed_tiles + j / dim) * dim * dim, dim * 4);
  } else if (kp == dim && cols_j == dim) {
    tile_load<6 + J>(b.data + p * b.ld + j, b.ld * 4);
  } else {
    pad_block(b.data + p * b.ld + j, b.ld, kp, cols_j, buf.b[J]);
    tile_load<6 + J>(buf.b[J], dim * 4);
  }
}

/// packed (the packed copy BOperand describes) = B's k pairs x n columns, zero-padded to
/// whole tiles; returns its BOperand.
inline BOperand pack_b(const bf16x2* b, index_t ldb, index_t k, index_t n, std::uint32_t* packed) {
  const index_t tiles = (n + dim - 1) / dim;
  for (index_t p = 0; p < k; p += dim)
    for (index_t t = 0; t < tiles; ++t)
      pad_block(b + p * ldb + t * dim, ldb, k - p < dim ? k - p : dim, n - t * dim < dim ? n - t * dim : dim,
                packed + (p / dim * tiles + t) * dim * dim);
  return {packed, 0, tiles};
}

/// C (rows x cols, at most 16 MT x 16 NT) (+)= A (rows x k pairs) B (k pairs x cols), all
/// of K in the accumulator tiles; B's columns from j on.
template <int MT, int NT>
TILEATTN_AMX_TARGET inline void block(index_t rows, index_t cols, index_t k, const bf16x2* a, index_t lda,
                                      const BOperand& b, index_t j, float* c, index_t ldc, bool accumulate,
                                      EdgeBuffers& buf) {
  const index_t r1 = rows - dim, c1 = cols - dim;  // rows and columns of the second tiles
  const CTile t00{c, rows < dim ? rows : dim, cols < dim ? cols : dim};
  const CTile t01{c + dim, t00.rows, c1 < dim ? c1 : dim};
  const CTile t10{c + dim * ldc, r1 < dim ? r1 : dim, t00.cols};
  const CTile t11{c + dim * ldc + dim, t10.rows, t01.cols};
  c_begin<0, 0>(t00, ldc, accumulate, buf);
  if constexpr (NT > 1) c_begin<0, 1>(t01, ldc, accumulate, buf);
  if constexpr (MT > 1) c_begin<1, 0>(t10, ldc, accumulate, buf);
  if constexpr (MT > 1 && NT > 1) c_begin<1, 1>(t11, ldc, accumulate, buf);
  // Each load is issued right before the first product that needs it, after the products
  // of the step before that read the same tile register (tiles are not renamed).
  for (index_t p = 0; p < k; p += dim) {
    const index_t kp = k - p < dim ? k - p : dim;
    a_load<0>(a + p, lda, t00.rows, kp, buf);
    b_load<0>(b, p, j, kp, t00.cols, buf);
    tile_dot<0, 0>();
    if constexpr (NT > 1) {
      b_load<1>(b, p, j + dim, kp, t01.cols, buf);
      tile_dot<0, 1>();
    }
    if constexpr (MT > 1) {
      a_load<1>(a + dim * lda + p, lda, t10.rows, kp, buf);
      tile_dot<1, 0>();
      if constexpr (NT > 1) tile_dot<1, 1>();
    }
  }
  c_end<0, 0>(t00, ldc, buf);
  if constexpr (NT > 1) c_end<0, 1>(t01, ldc, buf);
  if constexpr (MT > 1) c_end<1, 0>(t10, ldc, buf);
  if constexpr (MT > 1 && NT > 1) c_end<1, 1>(t11, ldc, buf);
}

/// C's rows [0, rows) (rows <= 32) across all n columns, in 32 x 32 blocks.
TILEATTN_AMX_TARGET inline void row_panel(index_t rows, index_t n, index_t k, const bf16x2* a, index_t lda,
                                          const BOperand& b, float* c, index_t ldc, bool accumulate,
                                          EdgeBuffers& buf) {
  for (index_t j = 0; j < n; j += 2 * dim) {
    const index_t cols = n - j < 2 * dim ? n - j : 2 * dim;
    if (rows > dim) {
      if (cols > dim) block<2, 2>(rows, cols, k, a, lda, b, j, c + j, ldc, accumulate, buf);
      else block<2, 1>(rows, cols, k, a, lda, b, j, c + j, ldc, accumulate, buf);
    } else {
      if (cols > dim) block<1, 2>(rows, cols, k, a, lda, b, j, c + j, ldc, accumulate, buf);
      else block<1, 1>(rows, cols, k, a, lda, b, j, c + j, ldc, accumulate, buf);
    }
  }
}

inline constexpr index_t transposed_depth = 256;  // pairs of K per transposed A panel

/// dst (rows x depth pairs, ld transposed_depth) = the transpose of a's block (depth x rows,
/// lda between rows), rows <= 32: the A operand given as its transpose, made A-shaped.
inline void transpose_panel(const bf16x2* a, index_t lda, index_t rows, index_t depth, std::uint32_t* dst) {
  const auto* src = reinterpret_cast<const float*>(a);
  auto* out = reinterpret_cast<float*>(dst);
  for (index_t i = 0; i < rows; i += dim)
    for (index_t p = 0; p < depth; p += dim) {
      const index_t ri = rows - i < dim ? rows - i : dim, dp = depth - p < dim ? depth - p : dim;
      if (ri == dim && dp == dim)
        avx512::detail::transpose_block<true>(dim, dim, src + p * lda + i, lda, out + i * transposed_depth + p,
                                              transposed_depth);
      else
        avx512::detail::transpose_block<false>(dp, ri, src + p * lda + i, lda, out + i * transposed_depth + p,
                                               transposed_depth);
    }
}

/// Tile sessions open on this thread: the outermost loads the configuration and releases the
/// tiles when it closes, so the products of a work item (begin_products) share one.
inline int& open_sessions() {
  thread_local int depth = 0;
  return depth;
}
TILEATTN_AMX_TARGET inline void open_session() {
#if !defined(TILEATTN_AMX_EMULATE)
  static const TileConfig config{};
  if (open_sessions() == 0) _tile_loadconfig(&config);
#endif
  ++open_sessions();
}
TILEATTN_AMX_TARGET inline void close_session() {
#if !defined(TILEATTN_AMX_EMULATE)
  if (open_sessions() == 1) _tile_release();
#endif
  --open_sessions();
}

/// A session for one call (code between calls, another library's included, may use tiles
/// its own way), unless the caller holds one.
struct TileSession {
  TileSession() { open_session(); }
  ~TileSession() { close_session(); }
  TileSession(const TileSession&) = delete;
  TileSession& operator=(const TileSession&) = delete;
};

/// Pairs of K up to which a product from zero with B prepared (S = Q K^T) keeps A resident
/// (scores_a_resident, one A tile per step of 16 pairs, four at most): 32, d <= 64. On the
/// Xeon (one core, a 64-row slab's Q K^T on a 512-key panel, amx_breakdown) it measured 1.36x
/// the 32 x 32 blocks at d 64 and 0.97x at d 128 (1.05-1.10x in a probe's best of 9): no
/// gain at 3 or 4 steps. Tests and benchmarks change it (64: up to d 128; 0: never); every
/// setting gives the same bits.
inline std::atomic<index_t> resident_a_max_pairs{2 * dim};

/// Rows of C from which B is packed once per call (each packed tile then serves m / 32 row
/// panels; fewer rows read B in place). Tests and benchmarks change it to compare both paths.
inline std::atomic<index_t> pack_min_rows{128};

/// What a thread's tile operands made in memory are for (tile_storage): a gemm's packed B,
/// and a decode step's Q^T tiles, V's rows interleaved into pairs and P's padded tiles.
enum class Scratch { packed_b, queries_t, value_pairs, probabilities, count };

/// Per-thread storage of `elements` 32-bit values, 64-byte aligned, one buffer per use, each
/// grown to the largest call's (the packed B: a chunk's pairs of K, at most transposed_depth,
/// by its columns, both in whole tiles).
inline std::uint32_t* tile_storage(Scratch use, index_t elements) {
  struct Storage {
    std::uint32_t* data = nullptr;
    index_t size = 0;
    ~Storage() { std::free(data); }
  };
  thread_local Storage storage[static_cast<int>(Scratch::count)];
  Storage& s = storage[static_cast<int>(use)];
  if (s.size < elements) {
    std::free(s.data);
    s.data = static_cast<std::uint32_t*>(std::aligned_alloc(64, static_cast<std::size_t>(elements + 15) / 16 * 64));
    if (s.data == nullptr) throw std::bad_alloc();
    s.size = elements;
  }
  return s.data;
}

/// The AMX gemm; the caller has checked amx_support::available(). K is taken in chunks of
/// transposed_depth pairs (C passes through memory between them, exactly), each chunk's B
/// packed when there are rows enough to reuse it, A transposed panel by panel for TransA.
template <bool Accumulate, bool TransA>
TILEATTN_AMX_TARGET void tile_gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16x2* b,
                                   index_t ldb, float* c, index_t ldc) {
  [[maybe_unused]] TileSession session;
  EdgeBuffers buf;
  const bool pack = m >= pack_min_rows.load(std::memory_order_relaxed);
  const index_t n_pad = (n + dim - 1) / dim * dim;
  const index_t depth_pad = ((k < transposed_depth ? k : transposed_depth) + dim - 1) / dim * dim;
  std::uint32_t* packed = pack ? tile_storage(Scratch::packed_b, depth_pad * n_pad) : nullptr;
  alignas(64) std::uint32_t panel[TransA ? 2 * dim * transposed_depth : 1];
  for (index_t p = 0; p < k; p += transposed_depth) {
    const index_t depth = k - p < transposed_depth ? k - p : transposed_depth;
    const bool accumulate = Accumulate || p > 0;
    const BOperand b_op = pack ? pack_b(b + p * ldb, ldb, depth, n, packed)
                               : BOperand{reinterpret_cast<const std::uint32_t*>(b + p * ldb), ldb};
    for (index_t i = 0; i < m; i += 2 * dim) {
      const index_t rows = m - i < 2 * dim ? m - i : 2 * dim;
      if constexpr (TransA) {
        transpose_panel(a + p * lda + i, lda, rows, depth, panel);
        row_panel(rows, n, depth, reinterpret_cast<const bf16x2*>(panel), transposed_depth, b_op, c + i * ldc, ldc,
                  accumulate, buf);
      } else {
        row_panel(rows, n, depth, a + i * lda + p, lda, b_op, c + i * ldc, ldc, accumulate, buf);
      }
    }
  }
}

/// The resident-A schedule's steps of K: tiles A 4 + s and B 2 + s % 2, products into C.
template <int C, int S>
TILEATTN_AMX_TARGET inline void resident_steps(const std::uint32_t* b_col, index_t b_step, int steps) {
  if constexpr (S < 4) {
    if (S < steps) {
      tile_load<2 + S % 2>(b_col + S * b_step, dim * 4);
      tile_dot_into<C, 4 + S, 2 + S % 2>();
      resident_steps<C, S + 1>(b_col, b_step, steps);
    }
  }
}

/// Loads A tiles 4 + S, 4 + S + 1, ... (steps of 16 pairs of K, as many as k has) from
/// rows [0, rows) of a; edges through zero-padded copies in a_edge.
template <int S>
TILEATTN_AMX_TARGET inline void resident_a_load(const bf16x2* a, index_t lda, index_t rows, index_t k,
                                                std::uint32_t (*a_edge)[dim * dim]) {
  if constexpr (S < 4) {
    if (S * dim >= k) return;
    const index_t kp = k - S * dim < dim ? k - S * dim : dim;
    if (rows == dim && kp == dim) {
      tile_load<4 + S>(a + S * dim, lda * 4);
    } else {
      pad_block(a + S * dim, lda, rows, kp, a_edge[S]);
      tile_load<4 + S>(a_edge[S], dim * 4);
    }
    resident_a_load<S + 1>(a, lda, rows, k, a_edge);
  }
}

/// One C tile of the resident-A schedule: columns [16 t, 16 t + cols) of the 16-row block at c.
template <int C>
TILEATTN_AMX_TARGET inline void resident_tile(const BOperand& b, index_t t, int steps, const CTile& out, index_t ldc,
                                              EdgeBuffers& buf) {
  tile_zero<C>();
  resident_steps<C, 0>(b.data + t * dim * dim, b.packed_tiles * dim * dim, steps);
  c_end<0, C>(out, ldc, buf);  // tile C
}

/// C (m x n) = A (m x k pairs) B (B packed in whole tiles, k <= 64 pairs): a
/// 16-row block's A stays in tiles 4 to 7 (a step of 16 pairs each) while its C tiles
/// alternate between tmm0 and tmm1, so a C tile's store runs under the next one's products,
/// against a 32 x 32 block's four stores and zeroings, which wait for each other, every few
/// steps in `block`. Each C element sums the same steps in the same order from zero: the same
/// bits as block<>. Used up to resident_a_max_pairs (docs/performance.md, issue 45).
TILEATTN_AMX_TARGET inline void scores_a_resident(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                                                  const BOperand& b, float* c, index_t ldc, EdgeBuffers& buf) {
  const int steps = static_cast<int>((k + dim - 1) / dim);
  const index_t tiles = (n + dim - 1) / dim;
  const auto cols_of = [n](index_t t) { return n - t * dim < dim ? n - t * dim : dim; };
  alignas(64) std::uint32_t a_edge[4][dim * dim];
  for (index_t i = 0; i < m; i += dim) {
    const index_t rows = m - i < dim ? m - i : dim;
    resident_a_load<0>(a + i * lda, lda, rows, k, a_edge);
    float* ci = c + i * ldc;
    for (index_t t = 0; t < tiles; t += 2) {
      resident_tile<0>(b, t, steps, {ci + t * dim, rows, cols_of(t)}, ldc, buf);
      if (t + 1 < tiles) resident_tile<1>(b, t + 1, steps, {ci + (t + 1) * dim, rows, cols_of(t + 1)}, ldc, buf);
    }
  }
}

/// tile_gemm (not transposed) with B packed whole beforehand (prepare_pairs): the same chunks
/// of K, blocks and tile products, so the same bits, without the pack per call; products from
/// zero over at most resident_a_max_pairs keep A resident (scores_a_resident, same bits).
template <bool Accumulate>
TILEATTN_AMX_TARGET void tile_gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                                            const PreparedPairs& b, float* c, index_t ldc) {
  [[maybe_unused]] TileSession session;
  EdgeBuffers buf;
  const auto* packed = reinterpret_cast<const std::uint32_t*>(b.data);
  if (!Accumulate && k <= std::min<index_t>(resident_a_max_pairs.load(std::memory_order_relaxed), 4 * dim))
    return scores_a_resident(m, n, k, a, lda, {packed, 0, b.packed_tiles}, c, ldc, buf);
  for (index_t p = 0; p < k; p += transposed_depth) {
    const index_t depth = k - p < transposed_depth ? k - p : transposed_depth;
    const BOperand b_op{packed + p / dim * b.packed_tiles * dim * dim, 0, b.packed_tiles};
    for (index_t i = 0; i < m; i += 2 * dim) {
      const index_t rows = m - i < 2 * dim ? m - i : 2 * dim;
      row_panel(rows, n, depth, a + i * lda + p, lda, b_op, c + i * ldc, ldc, Accumulate || p > 0, buf);
    }
  }
}
}  // namespace detail

/// Whether this process's bf16 pair products run on AMX tiles (checked once; always, emulated,
/// under TILEATTN_AMX_EMULATE).
inline bool tiles_in_use() {
#if defined(TILEATTN_AMX_EMULATE)
  return true;
#else
  return amx_support::available();
#endif
}

/// A decode or verify step's in-place products multiply bf16 pairs (arch/generic.hpp): on the
/// tiles where they are in use (gemm_nt_rows_pairs, gemm_rows_pairs below), else on
/// vdpbf16ps (Zen 5 runs it at the FMA's rate).
inline constexpr bool in_place_pairs = true;

/// On the tiles, from tile_decode_min_rows (8) query rows per K/V group: a tile's cost hardly depends on its rows
/// (up to 16), the FMAs' grows with them. On the 16-core Xeon (decode_breakdown, 4 rows, per
/// key in L1/L2) the tiles and the FMAs over rows converted to float cost the same (Q K^T
/// 6.6-11.3 ns against 12.3-14.0, P V 8.9-18.7 against 8.5-9.9: V's rows are interleaved into
/// pairs in a buffer first); a 4-token verify step (16 rows, B 1 x 32k, bf16, 3 runs in two
/// sessions) took 14.3-17.2 ms on the tiles against 23.6-26.2 on the FMAs at 2 threads and
/// 2.4-3.4 against 3.8-4.4 at 16, where the one-token step took 12.8-15.8 and 2.2-3.0. Fewer
/// rows convert to float (as do all where the tiles are not in use and
/// vdpbf16ps runs at under half the FMA rate: docs/paged.md). Tests and benchmarks change
/// tile_decode_min_rows (1: every group size; 17: never, in_place_max_rows being 16).
inline std::atomic<index_t> tile_decode_min_rows{8};
inline index_t in_place_pairs_min_rows() {
  return tiles_in_use() ? tile_decode_min_rows.load(std::memory_order_relaxed) : 1;
}

/// avx512::gemm's contract. Float operands: avx512's gemm. bf16 pairs: AMX tiles where the
/// process may use them, else vdpbf16ps (avx512's gemm).
template <bool Accumulate, bool TransA = false, class E>
void gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
          index_t ldc) {
  if constexpr (std::is_same_v<E, bf16x2>) {
    if (m > 0 && n > 0 && tiles_in_use()) {
      if (k > 0) {
        detail::tile_gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
      } else if constexpr (!Accumulate) {
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n; ++j) c[i * ldc + j] = 0.0f;
      }
      return;
    }
  }
  avx512::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}

// ---- B prepared once for many row slabs (arch/prepared_pairs.hpp) ----------------------------

/// Where the tiles are in use: B packed into buffer in whole 16 x 16 tiles, once for every
/// slab; else as vdpbf16ps reads it (avx512's).
inline PreparedPairs prepare_pairs(index_t k, index_t n, const bf16x2* b, index_t ldb, bf16x2* buffer) {
  if (!tiles_in_use()) return avx512::prepare_pairs(k, n, b, ldb, buffer);
  if (k <= 0 || n <= 0) return {b, ldb, 0};
  auto* packed = reinterpret_cast<std::uint32_t*>(buffer);
  const detail::BOperand op = detail::pack_b(b, ldb, k, n, packed);
  return {buffer, 0, op.packed_tiles};
}

/// gemm<Accumulate> with B prepared by prepare_pairs: the same bits as gemm on B itself.
template <bool Accumulate>
void gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const PreparedPairs& b, float* c,
                   index_t ldc) {
  if (b.packed_tiles == 0) return avx512::gemm_prepared<Accumulate>(m, n, k, a, lda, b, c, ldc);
  if (m <= 0 || n <= 0) return;
  if (k > 0) return detail::tile_gemm_prepared<Accumulate>(m, n, k, a, lda, b, c, ldc);
  if constexpr (!Accumulate)
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) c[i * ldc + j] = 0.0f;
}

// ---- A decode step's products with K and V rows read in place ------------------------------

namespace detail {
/// The bytes between rows[r] and rows[r + 1] when all 16 rows lie that far apart (a tile
/// load reads them where they are: 16 keys of one page), else 0.
inline index_t even_stride_bytes(const bf16* const* rows) {
  const std::ptrdiff_t step = rows[1] - rows[0];
  for (index_t r = 2; r < dim; ++r)
    if (rows[r] - rows[r - 1] != step) return 0;
  return step > 0 ? static_cast<index_t>(step) * 2 : 0;
}

/// (0, step, 2 step, ..., 15 step): the 32-bit lane offsets of a gather down a column.
inline __m512i lane_multiples(index_t step) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(step)));
}

/// The 32 values [p0, p0 + 32) of 16 key rows (fewer than 16: zero rows after) as A tile 4:
/// read in place when the rows are evenly spaced and the 32 values lie within k, else
/// copied, masked at k, into buf.
TILEATTN_AMX_TARGET inline void key_rows_load(const bf16* const* rows, index_t nj, index_t stride, index_t p0,
                                              index_t k, std::uint32_t* buf) {
  if (stride > 0 && nj == dim && p0 + 2 * dim <= k) return tile_load<4>(rows[0] + p0, stride);
  const __mmask32 m = avx512::detail::first_halves(k - p0);
  for (index_t r = 0; r < dim; ++r)
    _mm512_store_si512(buf + dim * r, r < nj ? _mm512_maskz_loadu_epi16(m, rows[r] + p0) : _mm512_setzero_si512());
  tile_load<4>(buf, dim * 4);
}

/// S^T's 16 x 16 block of keys [j0, j0 + nj) (tile 0, stored to cbuf) against the Q^T
/// tiles qt (one per 32 values of k), then its first m columns written as S's rows.
TILEATTN_AMX_TARGET inline void scores_block(index_t m, index_t nj, index_t k, const std::uint32_t* qt,
                                             const bf16* const* rows, float* c, index_t ldc, EdgeBuffers& buf) {
  const index_t stride = nj == dim ? even_stride_bytes(rows) : 0;
  tile_zero<0>();
  for (index_t p0 = 0; p0 < k; p0 += 2 * dim) {
    key_rows_load(rows, nj, stride, p0, k, buf.a[0]);
    tile_load<6>(qt + p0 / (2 * dim) * dim * dim, dim * 4);
    tile_dot<0, 0>();
  }
  tile_store<0>(buf.c[0], dim * 4);
  const __m512i column = lane_multiples(dim);
  const __mmask16 keys = lanes_mask(nj);
  for (index_t i = 0; i < m; ++i)  // S row i = column i of S^T
    _mm512_mask_storeu_ps(c + i * ldc, keys,
                          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keys, column, buf.c[0] + i, 4));
}
}  // namespace detail

/// generic::gemm_nt_rows_pairs on the tiles (the caller has checked tiles_in_use()): S^T =
/// K Q^T, 16 keys at a time, each A tile 16 key rows read where they lie (16 keys of a page,
/// evenly spaced) or copied, each B tile Q^T's 16 pairs of 16 query rows (built once per
/// call). Sums as tdpbf16ps makes them, per 32 values of k in order: not generic's bits.
TILEATTN_AMX_TARGET inline void tile_gemm_nt_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                                                        const bf16* const* b_rows, float* c, index_t ldc) {
  [[maybe_unused]] detail::TileSession session;
  detail::EdgeBuffers buf;
  const index_t dim = detail::dim, steps = (k + 2 * dim - 1) / (2 * dim), pairs = (k + 1) / 2;
  std::uint32_t* qt = detail::tile_storage(detail::Scratch::queries_t, steps * dim * dim);
  const __m512i row_at = detail::lane_multiples(lda);
  for (index_t i0 = 0; i0 < m; i0 += dim) {
    const index_t mi = m - i0 < dim ? m - i0 : dim;
    const __mmask16 rows_in = detail::lanes_mask(mi);
    for (index_t p = 0; p < steps * dim; ++p)  // qt[p / 16][p % 16][i] = pair p of query row i0 + i
      _mm512_store_si512(qt + p * dim, p < pairs ? _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows_in, row_at,
                                                                               a + i0 * lda + p, 4)
                                                 : _mm512_setzero_si512());
    for (index_t j0 = 0; j0 < n; j0 += dim)
      detail::scores_block(mi, n - j0 < dim ? n - j0 : dim, k, qt, b_rows + j0, c + i0 * ldc + j0, ldc, buf);
  }
}

/// generic::gemm_rows_pairs on the tiles: O (16 query rows x 64 columns in tiles 0-3) += P
/// (A, 16 pairs of keys, zero-padded once per call; tiles 4 and 5 the same) V (B, two V rows
/// interleaved into pairs, 16 columns a tile, made in a buffer 128 keys at a time before the
/// tiles load them: a tile load waits for the stores it reads). Sums per 32 keys in order,
/// as tdpbf16ps makes them: not generic's bits.
TILEATTN_AMX_TARGET inline void tile_gemm_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                                                     const bf16* const* b_rows, float* c, index_t ldc) {
  [[maybe_unused]] detail::TileSession session;
  detail::EdgeBuffers buf;
  const index_t dim = detail::dim, pairs = (k + 1) / 2;
  constexpr index_t blocks = 4;  // pair blocks (16 pairs: 32 keys) made before the products read them
  // V's rows interleaved into pairs for 64 columns: vt[b][t][p][j] = (v[2q][16t + j], v[2q + 1][16t + j]),
  // q = 16 (q0 + b) + p; made for `blocks` pair blocks at a time, so that the tile loads come
  // well after the stores that made them.
  std::uint32_t* vt = detail::tile_storage(detail::Scratch::value_pairs, blocks * 4 * dim * dim);
  const __m512i lo =
      _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005, 0x00260006, 0x00270007,
                        0x00280008, 0x00290009, 0x002a000a, 0x002b000b, 0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  const index_t a_blocks = (pairs + dim - 1) / dim;
  std::uint32_t* pa = detail::tile_storage(detail::Scratch::probabilities, a_blocks * dim * dim);
  for (index_t i0 = 0; i0 < m; i0 += dim) {
    const index_t mi = m - i0 < dim ? m - i0 : dim;
    for (index_t q0 = 0; q0 < pairs; q0 += dim)  // P's A tiles, zero-padded once for every column group
      detail::pad_block(a + i0 * lda + q0, lda, mi, pairs - q0 < dim ? pairs - q0 : dim, pa + q0 * dim);
    for (index_t j0 = 0; j0 < n; j0 += 4 * dim) {
      const index_t cols = n - j0 < 4 * dim ? n - j0 : 4 * dim;
      const auto tile_cols = [&](index_t t) {
        return cols <= t * dim ? 0 : cols - t * dim < dim ? cols - t * dim : dim;
      };
      float* o = c + i0 * ldc + j0;
      const detail::CTile t[4] = {{o, mi, tile_cols(0)},
                                  {o + dim, mi, tile_cols(1)},
                                  {o + 2 * dim, mi, tile_cols(2)},
                                  {o + 3 * dim, mi, tile_cols(3)}};
      const __mmask32 m0 = avx512::detail::first_halves(cols),
                      m1 = avx512::detail::first_halves(cols > 32 ? cols - 32 : 0);
      detail::c_begin<0, 0>(t[0], ldc, true, buf);
      detail::c_begin<0, 1>(t[1], ldc, true, buf);
      detail::c_begin<1, 0>(t[2], ldc, true, buf);
      detail::c_begin<1, 1>(t[3], ldc, true, buf);
      for (index_t g0 = 0; g0 < pairs; g0 += blocks * dim) {
        const index_t group = pairs - g0 < blocks * dim ? pairs - g0 : blocks * dim;
        for (index_t q = 0; q < (group + dim - 1) / dim * dim; ++q) {  // B rows: key pair g0 + q
          __m512i x0 = _mm512_setzero_si512(), x1 = x0, y0 = x0, y1 = x0;
          if (q < group) {
            const index_t r = 2 * (g0 + q);
            x0 = _mm512_maskz_loadu_epi16(m0, b_rows[r] + j0), x1 = _mm512_maskz_loadu_epi16(m1, b_rows[r] + j0 + 32);
            if (r + 1 < k)
              y0 = _mm512_maskz_loadu_epi16(m0, b_rows[r + 1] + j0),
              y1 = _mm512_maskz_loadu_epi16(m1, b_rows[r + 1] + j0 + 32);
          }
          std::uint32_t* row = vt + (q / dim) * 4 * dim * dim + (q % dim) * dim;
          _mm512_store_si512(row, _mm512_permutex2var_epi16(x0, lo, y0));
          _mm512_store_si512(row + dim * dim, _mm512_permutex2var_epi16(x0, hi, y0));
          _mm512_store_si512(row + 2 * dim * dim, _mm512_permutex2var_epi16(x1, lo, y1));
          _mm512_store_si512(row + 3 * dim * dim, _mm512_permutex2var_epi16(x1, hi, y1));
        }
        for (index_t q0 = 0; q0 < group; q0 += dim) {
          const std::uint32_t* b = vt + (q0 / dim) * 4 * dim * dim;
          detail::tile_load<4>(pa + (g0 + q0) * dim, dim * 4);
          detail::tile_load<5>(pa + (g0 + q0) * dim, dim * 4);
          detail::tile_load<6>(b, dim * 4);
          detail::tile_load<7>(b + dim * dim, dim * 4);
          detail::tile_dot<0, 0>();
          detail::tile_dot<0, 1>();
          detail::tile_load<6>(b + 2 * dim * dim, dim * 4);
          detail::tile_load<7>(b + 3 * dim * dim, dim * 4);
          detail::tile_dot<1, 0>();
          detail::tile_dot<1, 1>();
        }
      }
      detail::c_end<0, 0>(t[0], ldc, buf);
      detail::c_end<0, 1>(t[1], ldc, buf);
      detail::c_end<1, 0>(t[2], ldc, buf);
      detail::c_end<1, 1>(t[3], ldc, buf);
    }
  }
}

/// A decode step's in-place products on pairs: on the tiles where they are in use, else
/// avx512's (vdpbf16ps).
inline void gemm_nt_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                               float* c, index_t ldc) {
  if (m > 0 && n > 0 && tiles_in_use()) return tile_gemm_nt_rows_pairs(m, n, k, a, lda, b_rows, c, ldc);
  avx512::gemm_nt_rows_pairs(m, n, k, a, lda, b_rows, c, ldc);
}
inline void gemm_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                            float* c, index_t ldc) {
  if (m > 0 && n > 0 && k > 0 && tiles_in_use()) return tile_gemm_rows_pairs(m, n, k, a, lda, b_rows, c, ldc);
  avx512::gemm_rows_pairs(m, n, k, a, lda, b_rows, c, ldc);
}

inline index_t product_slab_rows() {
  return tiles_in_use() ? tile_slab_rows.load(std::memory_order_relaxed) : avx512::product_slab_rows();
}
/// Panels of 512 keys on tiles (one row max and one O rescale per 512 keys; the Xeon, slabs of
/// 64: 474 GFLOP/s against 417 with 128-key panels on one thread, 948 against 830 on two).
inline index_t product_panel_keys() { return tiles_in_use() ? 512 : avx512::product_panel_keys(); }

/// A work item's products share one tile configuration: loaded here, the tiles released by
/// the matching end_products (they nest); nothing where the tiles are not in use.
inline void begin_products() {
  if (tiles_in_use()) detail::open_session();
}
inline void end_products() {
  if (tiles_in_use()) detail::close_session();
}

}  // namespace tileattn::arch::amx

#if TILEATTN_ARCH_X86_DISPATCH
TILEATTN_TARGET_END
#endif

#endif  // AMX kernels compiled
