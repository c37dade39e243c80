// tests/arch/amx_kernels_test.cpp: the AMX bf16 pair gemm (arch/amx.hpp) and the kernels
// that run on it.
//
// Where this process may use AMX tiles (arch/amx_support.hpp): the tile gemm against double
// on awkward shapes, with A given as it is or transposed, accumulating or not, reading
// nothing past its operands (NaN lies there) and writing nothing past C; then the bf16
// forward under FlashAttention's rule (error <= 2x a naive bf16 implementation's) and the
// backward (<= 3x), both bitwise identical across thread counts and backends. Elsewhere
// those tests are skipped with the reason; the status tests run everywhere. The other
// suites, built with -march=native, run the same kernels: on an AMX machine through the
// tiles, on the development and CI machines through the vdpbf16ps fallback.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/backward_support.hpp"
#include "support/naive_same_precision.hpp"
#include "support/paged_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/arch/amx_support.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

namespace support = arch::amx_support;

#if defined(TILEATTN_HAS_AMX_KERNELS)
#define SKIP_WITHOUT_AMX()        \
  if (!arch::amx::tiles_in_use()) \
  GTEST_SKIP() << "AMX not usable here: " << support::describe(support::status())
#endif

TEST(AmxSupport, ReportsOneStatusToEveryThread) {
  std::vector<support::Status> seen(8);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < seen.size(); ++t) threads.emplace_back([&seen, t] { seen[t] = support::status(); });
  for (auto& t : threads) t.join();
  for (const support::Status s : seen) EXPECT_EQ(s, seen[0]);
  EXPECT_EQ(support::available(), seen[0] == support::Status::usable);
  std::printf("[ amx ] %s; arch::native is %s%s\n", support::describe(seen[0]), arch::native_name(),
#if defined(TILEATTN_AMX_EMULATE)
              " (tiles emulated in C++)"
#else
              ""
#endif
  );
}

TEST(AmxSupport, EnvironmentVariableTurnsItOff) {
  ::setenv("TILEATTN_NO_AMX", "1", 1);
  const support::Status off = support::detail::check();
  ::setenv("TILEATTN_NO_AMX", "0", 1);
  [[maybe_unused]] const support::Status zero = support::detail::check();
  ::unsetenv("TILEATTN_NO_AMX");
#if defined(TILEATTN_AMX_DETECTION)
  EXPECT_EQ(off, support::Status::disabled_by_environment);
  EXPECT_NE(zero, support::Status::disabled_by_environment);
#else
  EXPECT_EQ(off, support::Status::not_x86_64_linux);
#endif
  EXPECT_EQ(support::detail::check(), support::status());
}

#if defined(TILEATTN_HAS_AMX_KERNELS)

TEST(AmxSupport, NativeArchIsAmxAndMultipliesPairs) {
  EXPECT_STREQ(arch::native::name, "avx512+amx");
  EXPECT_TRUE(arch::native::bf16_dot_product);
}

// ---- The gemm --------------------------------------------------------------------------

constexpr float c_sentinel = 12345.0f;

bf16x2 nan_pair() { return std::bit_cast<bf16x2>(0x7fc07fc0u); }

/// A pair of bf16 values drawn from N(0, 1) (no subnormals, no zeros to hide a missing term).
bf16x2 random_pair(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const auto value = [&] {
    float x = nd(rng);
    if (std::fabs(x) < 1e-3f) x = 0.5f;
    return bf16(x);
  };
  bf16x2 p;
  p.lo = value();
  p.hi = value();
  return p;
}

struct GemmCase {
  index_t m, n, k;
  bool trans_a, accumulate;
};

/// Runs arch::native::gemm on one case and checks it against double, and that the padding
/// (NaN in the operands' unused columns and rows, a sentinel around C) is neither read nor
/// written.
void check_gemm(const GemmCase& g, std::mt19937& rng) {
  SCOPED_TRACE("m " + std::to_string(g.m) + " n " + std::to_string(g.n) + " k " + std::to_string(g.k) +
               (g.trans_a ? " A^T" : "") + (g.accumulate ? " +=" : ""));
  const index_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const index_t lda = a_cols + 3, ldb = g.n + 5, ldc = g.n + 7;
  std::vector<bf16x2> a(static_cast<std::size_t>((a_rows + 2) * lda), nan_pair());
  std::vector<bf16x2> b(static_cast<std::size_t>((g.k + 2) * ldb), nan_pair());
  std::vector<float> c(static_cast<std::size_t>((g.m + 2) * ldc), c_sentinel);
  for (index_t r = 0; r < a_rows; ++r)
    for (index_t q = 0; q < a_cols; ++q) a[static_cast<std::size_t>(r * lda + q)] = random_pair(rng);
  for (index_t r = 0; r < g.k; ++r)
    for (index_t q = 0; q < g.n; ++q) b[static_cast<std::size_t>(r * ldb + q)] = random_pair(rng);
  std::normal_distribution<float> nd;
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) c[static_cast<std::size_t>(i * ldc + j)] = g.accumulate ? nd(rng) : -7.0f;
  const std::vector<float> c0 = c;

  if (g.trans_a) {
    if (g.accumulate) arch::native::gemm<true, true>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), ldc);
    else arch::native::gemm<false, true>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), ldc);
  } else {
    if (g.accumulate) arch::native::gemm<true>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), ldc);
    else arch::native::gemm<false>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), ldc);
  }

  int bad = 0;
  for (index_t i = 0; i < g.m + 2; ++i)
    for (index_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (i >= g.m || j >= g.n) {
        if (c[at] != c_sentinel && ++bad < 5) ADD_FAILURE() << "wrote outside C at (" << i << ", " << j << ")";
        continue;
      }
      double want = g.accumulate ? c0[at] : 0.0, magnitude = std::fabs(want);
      for (index_t p = 0; p < g.k; ++p) {
        const bf16x2 x = a[static_cast<std::size_t>(g.trans_a ? p * lda + i : i * lda + p)];
        const bf16x2 y = b[static_cast<std::size_t>(p * ldb + j)];
        const double hi = double(to_float(x.hi)) * to_float(y.hi), lo = double(to_float(x.lo)) * to_float(y.lo);
        want += hi + lo;
        magnitude += std::fabs(hi) + std::fabs(lo);
      }
      // 2k + 1 roundings of at most one fp32 unit roundoff of the running magnitude each.
      const double bound = (2.0 * static_cast<double>(g.k) + 1.0) * 0x1p-24 * magnitude;
      if (!(std::fabs(c[at] - want) <= bound) && ++bad < 5)
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << c[at] << ", want " << want << " +- " << bound;
    }
  EXPECT_EQ(bad, 0);
}

TEST(AmxGemm, MatchesDoubleOnAwkwardShapesWithoutTouchingPadding) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(16);
  int cases = 0;
  const index_t pack_default = arch::amx::detail::pack_min_rows;
  for (const index_t pack_from : {index_t{0}, index_t{1} << 40})  // B packed always, never
    for (const index_t m : {1, 15, 16, 17, 32, 33, 70})
      for (const index_t n : {1, 16, 17, 31, 32, 48, 100})
        for (const index_t k : {1, 7, 16, 17, 64, 300})
          for (const bool trans_a : {false, true})
            for (const bool accumulate : {false, true}) {
              arch::amx::detail::pack_min_rows = pack_from;
              check_gemm({m, n, k, trans_a, accumulate}, rng);
              arch::amx::detail::pack_min_rows = pack_default;
              ++cases;
              if (HasFailure()) return;
            }
  std::printf("[ amx ] %d gemm cases within the fp32 bound\n", cases);
}

TEST(AmxGemm, EmptyShapes) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(17);
  for (const GemmCase g : {GemmCase{0, 5, 5, false, false}, GemmCase{5, 0, 5, false, true}, GemmCase{5, 5, 0, false, false},
                           GemmCase{5, 5, 0, true, true}})
    check_gemm(g, rng);
}

/// On attention-sized tiles (the shapes the forward and backward give it), a second call on
/// the same data gives the same bits, and the result sits within fp32 rounding of vdpbf16ps's.
TEST(AmxGemm, AttentionTilesAreReproducibleAndAgreeWithTheDotProductKernel) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(18);
  const index_t m = 128, n = 512, k = 64;  // S = Q K^T at Br 128, Bc 512, d 128
  std::vector<bf16x2> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (auto& x : a) x = random_pair(rng);
  for (auto& x : b) x = random_pair(rng);
  std::vector<float> c1(static_cast<std::size_t>(m * n)), c2 = c1, c3 = c1;
  arch::native::gemm<false>(m, n, k, a.data(), k, b.data(), n, c1.data(), n);
  arch::native::gemm<false>(m, n, k, a.data(), k, b.data(), n, c2.data(), n);
  arch::avx512::gemm<false>(m, n, k, a.data(), k, b.data(), n, c3.data(), n);
  double worst = 0;
  for (std::size_t e = 0; e < c1.size(); ++e) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(c1[e]), std::bit_cast<std::uint32_t>(c2[e])) << "element " << e;
    worst = std::max(worst, std::fabs(double(c1[e]) - c3[e]));
  }
  EXPECT_LT(worst, 1e-4);
  // How the hardware orders a pair's two products: count the elements that differ from a
  // sequential fp32 sum taking each pair's low half first, and from one taking the high half
  // first (vdpbf16ps's order). Informational: the contract is the bound above.
  // Also from sums that round once per pair, and once per instruction (16 pairs, exactly).
  int low_first = 0, high_first = 0, per_pair = 0, per_16_pairs = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      float lo_hi = 0.0f, hi_lo = 0.0f, pair = 0.0f, group = 0.0f;
      double exact = 0.0;
      for (index_t p = 0; p < k; ++p) {
        const bf16x2 x = a[static_cast<std::size_t>(i * k + p)], y = b[static_cast<std::size_t>(p * n + j)];
        const float lo = to_float(x.lo) * to_float(y.lo), hi = to_float(x.hi) * to_float(y.hi);  // exact
        lo_hi += lo;
        lo_hi += hi;
        hi_lo += hi;
        hi_lo += lo;
        pair = static_cast<float>(double(pair) + (double(lo) + double(hi)));
        exact += double(lo) + double(hi);
        if (p % 16 == 15 || p == k - 1) group = static_cast<float>(double(group) + exact), exact = 0.0;
      }
      const float got = c1[static_cast<std::size_t>(i * n + j)];
      low_first += got != lo_hi;
      high_first += got != hi_lo;
      per_pair += got != pair;
      per_16_pairs += got != group;
    }
  std::printf("[ amx ] max |AMX - vdpbf16ps| on a 128 x 512 x 128 tile: %.3g; elements differing from fp32 sums "
              "rounding per product, low half first: %d, high half first: %d; per pair: %d; per 16 pairs: %d (of %d)\n",
              worst, low_first, high_first, per_pair, per_16_pairs, static_cast<int>(m * n));
}

/// B prepared once (packed into whole tiles) and multiplied by row slabs gives the bits of the
/// gemm on B itself, on awkward shapes, with and without accumulation, K past one chunk.
TEST(AmxGemm, PreparedOperandGivesTheGemmsBits) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(29);
  struct ResidentUpTo64 {  // scores_a_resident for every step count while the test runs
    index_t saved = arch::amx::detail::resident_a_max_pairs.exchange(64);
    ~ResidentUpTo64() { arch::amx::detail::resident_a_max_pairs = saved; }
  } resident;
  struct Shape {
    index_t m, n, k;
  };
  // Products from zero over few pairs keep A resident (arch::amx::detail::scores_a_resident, up
  // to resident_a_max_pairs, raised here to its most, 64): every step count (1 to 4, the last
  // one partial or whole), rows and columns off the 16 grid.
  for (const Shape sh : {Shape{1, 1, 1}, Shape{17, 33, 5}, Shape{32, 128, 64}, Shape{45, 200, 70},
                         Shape{128, 512, 64}, Shape{33, 16, 300}, Shape{70, 17, 257}, Shape{20, 47, 40},
                         Shape{3, 250, 33}, Shape{64, 512, 32}, Shape{31, 64, 16}, Shape{16, 15, 63}}) {
    SCOPED_TRACE(std::to_string(sh.m) + " x " + std::to_string(sh.n) + " x " + std::to_string(sh.k));
    const index_t lda = sh.k + 3, ldb = sh.n + 5, ldc = sh.n + 2;
    std::vector<bf16x2> a(static_cast<std::size_t>(sh.m * lda)), b(static_cast<std::size_t>(sh.k * ldb));
    for (auto& x : a) x = random_pair(rng);
    for (auto& x : b) x = random_pair(rng);
    const auto capacity = static_cast<std::size_t>(arch::prepared_pairs_capacity(sh.k, sh.n));
    std::unique_ptr<bf16x2[], decltype(&std::free)> buffer(
        static_cast<bf16x2*>(std::aligned_alloc(64, capacity * sizeof(bf16x2))), &std::free);
    const arch::PreparedPairs prepared = arch::native::prepare_pairs(sh.k, sh.n, b.data(), ldb, buffer.get());
    EXPECT_GT(prepared.packed_tiles, 0);
    for (const bool accumulate : {false, true}) {
      std::vector<float> want(static_cast<std::size_t>(sh.m * ldc));
      for (auto& x : want) x = std::normal_distribution<float>()(rng);
      std::vector<float> got = want;
      if (accumulate) {
        arch::native::gemm<true>(sh.m, sh.n, sh.k, a.data(), lda, b.data(), ldb, want.data(), ldc);
        for (index_t r0 = 0; r0 < sh.m; r0 += 32)  // by slabs of 32 rows, as the forward
          arch::native::gemm_prepared<true>(std::min<index_t>(32, sh.m - r0), sh.n, sh.k, a.data() + r0 * lda, lda,
                                            prepared, got.data() + r0 * ldc, ldc);
      } else {
        arch::native::gemm<false>(sh.m, sh.n, sh.k, a.data(), lda, b.data(), ldb, want.data(), ldc);
        arch::native::gemm_prepared<false>(sh.m, sh.n, sh.k, a.data(), lda, prepared, got.data(), ldc);
      }
      for (std::size_t e = 0; e < got.size(); ++e)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[e]), std::bit_cast<std::uint32_t>(want[e]))
            << "element " << e << (accumulate ? ", accumulating" : "");
    }
  }
}

// ---- The kernels on AMX ----------------------------------------------------------------

#if defined(TILEATTN_HAS_AMX_KERNELS)
/// This binary runs decode's in-place products on the tiles for every group size
/// (arch::amx::tile_decode_min_rows 1; by default from 8 query rows per K/V group, which the
/// other suites run on an AMX machine).
struct DecodeOnTiles : ::testing::Environment {
  void SetUp() override { arch::amx::tile_decode_min_rows = 1; }
  void TearDown() override { arch::amx::tile_decode_min_rows = 8; }
};
[[maybe_unused]] ::testing::Environment* const decode_on_tiles_environment =
    ::testing::AddGlobalTestEnvironment(new DecodeOnTiles);
#endif

struct KernelCase {
  std::string name;
  test::ProblemShape shape;
  bool causal;
};

std::vector<KernelCase> kernel_cases() {
  return {{"one query", {1, 1, 17, 2, 1, 64, 64}, false},
          {"17 x 127 causal, d 40", {1, 17, 127, 2, 2, 40, 40}, true},
          {"127 x 300, GQA, d 128", {2, 127, 300, 4, 2, 128, 128}, false},
          {"300 causal, d 128", {1, 300, 300, 2, 2, 128, 128}, true},
          {"1000 causal, d 64 / 72", {1, 1000, 1000, 1, 1, 64, 72}, true},
          // K and V read in place (decode, verify): the products on tiles with rows where they lie
          {"decode, GQA 4, 1001 keys", {2, 1, 1001, 8, 2, 128, 128}, false},
          {"verify 3 x 127, d 80 / 64", {1, 3, 127, 4, 1, 80, 64}, true},
          {"decode, GQA 16, d 256 / 128", {1, 1, 300, 16, 1, 256, 128}, false}};
}

std::vector<float> to_floats(const std::vector<bf16>& x) {
  std::vector<float> f(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) f[i] = to_float(x[i]);
  return f;
}

TEST(AmxKernels, Bf16ForwardWithinTwiceNaiveBf16) {
  SKIP_WITHOUT_AMX();
  for (const KernelCase& c : kernel_cases()) {
    SCOPED_TRACE(c.name);
    const test::ProblemShape& s = c.shape;
    test::BackwardProblem<bf16> p(s, 1600);
    ForwardOptions opts;
    opts.causal = c.causal;
    p.forward(opts);
    const reference::Options ref_opts = reference::Options::from(opts);
    const std::vector<float> q = to_floats(p.q), k = to_floats(p.k), v = to_floats(p.v);
    const auto qf = make_bshd<const float>(q.data(), s.batch, s.seqlen_q, s.heads, s.head_dim);
    const auto kf = make_bshd<const float>(k.data(), s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    const auto vf = make_bshd<const float>(v.data(), s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v);
    const auto ref = reference::attention(qf, kf, vf, ref_opts);
    std::vector<float> naive_o(p.o.size()), naive_lse(p.lse.size());
    test::naive_same_precision<bf16>(qf, kf, vf, ref_opts,
                                     make_bshd(naive_o.data(), s.batch, s.seqlen_q, s.heads, s.head_dim_v),
                                     make_lse(naive_lse.data(), s.batch, s.heads, s.seqlen_q));
    double err = 0, naive_err = 0;
    for (std::size_t e = 0; e < p.o.size(); ++e) {
      err = std::max(err, std::fabs(to_float(p.o[e]) - ref.o[e]));
      naive_err = std::max(naive_err, std::fabs(naive_o[e] - ref.o[e]));
    }
    EXPECT_GT(naive_err, 0.0);
    EXPECT_LE(err, 2.0 * naive_err + 1e-5) << "naive bf16 error " << naive_err;
    std::printf("[ amx ] %-24s forward max error %.3g, naive bf16 %.3g\n", c.name.c_str(), err, naive_err);
  }
}

TEST(AmxKernels, Bf16DecodeOnPagesOfAnySizeIsTheContiguousForwardBitwise) {
  // A tile reads 16 keys' rows where they lie when they are evenly spaced (16 keys of one
  // page, or a contiguous cache) and copies them otherwise (pages of 1 or 5 tokens): the
  // same values in the tile, so the same bits as the contiguous forward.
  SKIP_WITHOUT_AMX();
  for (const index_t page : {1, 5, 16, 32})
    for (const index_t q_len : {1, 3}) {
      SCOPED_TRACE("page " + std::to_string(page) + ", q_len " + std::to_string(q_len));
      test::PagedShape s{{1001, 17, 300}, q_len, 8, 2, 80, 64, page};
      test::PagedBatch<bf16> batch(s, 31);
      PagedOptions opt;
      opt.num_splits = 1;
      batch.run(opt);
      std::vector<bf16> k_all, v_all;
      std::vector<std::int32_t> cu_q{0}, cu_k{0};
      for (index_t b = 0; b < s.batch(); ++b) {
        k_all.insert(k_all.end(), batch.k_seq[b].begin(), batch.k_seq[b].end());
        v_all.insert(v_all.end(), batch.v_seq[b].begin(), batch.v_seq[b].end());
        cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(q_len));
        cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(s.k_lens[static_cast<std::size_t>(b)]));
      }
      std::vector<bf16> o(batch.o.size());
      forward_varlen(make_thd<const bf16>(batch.q.data(), cu_q.back(), s.heads_q, s.head_dim),
                     make_thd<const bf16>(k_all.data(), cu_k.back(), s.heads_kv, s.head_dim),
                     make_thd<const bf16>(v_all.data(), cu_k.back(), s.heads_kv, s.dv()),
                     make_thd(o.data(), cu_q.back(), s.heads_q, s.dv()), PackedLseView{},
                     VarlenSequences{cu_q, cu_k, q_len, 1001}, opt);
      for (std::size_t e = 0; e < o.size(); ++e) ASSERT_EQ(o[e].bits, batch.o[e].bits) << "element " << e;
    }
}

TEST(AmxKernels, Bf16DecodeChoosesTilesByGroupRowsPerSequence) {
  // With the default threshold (8 query rows per K/V group), one varlen call whose sequences
  // have 1 and 3 new tokens (GQA 4: 4 and 12 rows) runs float items and tile items side by
  // side in one scratch: each sequence's O is the bits of a call of its own, and the 4-row
  // sequences' the bits of the float products (threshold 17).
  SKIP_WITHOUT_AMX();
  struct Threshold {
    explicit Threshold(index_t rows) : saved(arch::amx::tile_decode_min_rows.exchange(rows)) {}
    ~Threshold() { arch::amx::tile_decode_min_rows = saved; }
    index_t saved;
  };
  const index_t hq = 8, hkv = 2, d = 64;
  const std::vector<index_t> q_lens{1, 3, 1, 3}, k_lens{300, 17, 1001, 129};
  std::mt19937 rng(41);
  std::normal_distribution<float> normal;
  const auto random_rows = [&](index_t rows, index_t heads) {
    std::vector<bf16> x(static_cast<std::size_t>(rows * heads * d));
    for (auto& e : x) e = from_float<bf16>(normal(rng));
    return x;
  };
  std::vector<std::vector<bf16>> q, k, v;
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    q.push_back(random_rows(q_lens[b], hq));
    k.push_back(random_rows(k_lens[b], hkv));
    v.push_back(random_rows(k_lens[b], hkv));
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(q_lens[b]));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(k_lens[b]));
  }
  const auto joined = [](const std::vector<std::vector<bf16>>& parts) {
    std::vector<bf16> all;
    for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
    return all;
  };
  const std::vector<bf16> q_all = joined(q), k_all = joined(k), v_all = joined(v);
  ForwardOptions opt;
  opt.causal = true;
  const auto run_all = [&] {
    std::vector<bf16> o(q_all.size());
    forward_varlen(make_thd<const bf16>(q_all.data(), cu_q.back(), hq, d),
                   make_thd<const bf16>(k_all.data(), cu_k.back(), hkv, d),
                   make_thd<const bf16>(v_all.data(), cu_k.back(), hkv, d), make_thd(o.data(), cu_q.back(), hq, d),
                   PackedLseView{}, VarlenSequences{cu_q, cu_k, 3, 1001}, opt);
    return o;
  };
  const auto run_one = [&](std::size_t b) {
    std::vector<bf16> o(q[b].size());
    forward(make_bshd<const bf16>(q[b].data(), 1, q_lens[b], hq, d),
            make_bshd<const bf16>(k[b].data(), 1, k_lens[b], hkv, d),
            make_bshd<const bf16>(v[b].data(), 1, k_lens[b], hkv, d), make_bshd(o.data(), 1, q_lens[b], hq, d), opt);
    return o;
  };
  Threshold by_rows(8);
  const std::vector<bf16> all = run_all();
  std::vector<bf16> floats_all;
  {
    Threshold never(17);
    floats_all = run_all();
  }
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + ", " + std::to_string(q_lens[b]) + " new tokens");
    const std::vector<bf16> alone = run_one(b);
    const std::size_t first = static_cast<std::size_t>(cu_q[b] * hq * d);
    bool tiles_differ = false;
    for (std::size_t e = 0; e < alone.size(); ++e) {
      ASSERT_EQ(all[first + e].bits, alone[e].bits) << "element " << e;
      if (q_lens[b] == 1) {
        ASSERT_EQ(all[first + e].bits, floats_all[first + e].bits) << "element " << e;
      }
      tiles_differ = tiles_differ || all[first + e].bits != floats_all[first + e].bits;
    }
    if (q_lens[b] == 3) {
      EXPECT_TRUE(tiles_differ) << "12-row groups ran on the float products";
    }
  }
}

TEST(AmxKernels, Bf16BackwardWithinThriceNaiveBf16) {
  SKIP_WITHOUT_AMX();
  for (const KernelCase& c : kernel_cases()) {
    SCOPED_TRACE(c.name);
    test::BackwardProblem<bf16> p(c.shape, 1700);
    BackwardOptions opts;
    opts.causal = c.causal;
    p.forward(opts);
    p.backward(opts);
    const reference::Options ref_opts = reference::Options::from(opts);
    const reference::BackwardResult ref = p.reference(ref_opts);
    const reference::NaiveBackwardF naive = p.naive(ref_opts);
    const auto check = [&](const std::vector<float>& got, const auto& want, const std::vector<float>& naive_got,
                           const std::string& name) {
      const test::GradError e = test::grad_error(got, want, name);
      const test::GradError n = test::grad_error(naive_got, want, name + " (naive)");
      EXPECT_EQ(e.problem, "");
      const double bound = 3.0 * std::max(n.max_error, e.magnitude / 256) + 2e-4 * e.magnitude;
      EXPECT_LE(e.max_error, bound) << name << ": naive " << n.max_error << ", magnitude " << e.magnitude;
      EXPECT_GT(e.magnitude, 0.0) << name;
      std::printf("[ amx ] %-24s %s max error %.3g, naive bf16 %.3g\n", c.name.c_str(), name.c_str(), e.max_error,
                  n.max_error);
    };
    check(p.grad_q(), ref.dq, naive.dq, "dq");
    check(p.grad_k(), ref.dk, naive.dk, "dk");
    check(p.grad_v(), ref.dv, naive.dv, "dv");
  }
}

TEST(AmxKernels, Bf16BitwiseIdenticalAcrossThreadCountsAndBackends) {
  SKIP_WITHOUT_AMX();
  const test::ProblemShape s{2, 300, 333, 4, 2, 128, 128};
  struct Outputs {
    std::vector<std::uint32_t> o, lse, dq, dk, dv;
  };
  const auto bits = [](const std::vector<bf16>& x) {
    std::vector<std::uint32_t> b;
    for (const bf16 v : x) b.push_back(v.bits);
    return b;
  };
  const auto run = [&](Execution e) {
    test::BackwardProblem<bf16> p(s, 1800);
    BackwardOptions opts;
    opts.causal = true;
    opts.execution = e;
    p.forward(opts);
    p.backward(opts);
    Outputs out{bits(p.o), {}, bits(p.dq), bits(p.dk), bits(p.dv)};
    for (const float l : p.lse) out.lse.push_back(std::bit_cast<std::uint32_t>(l));
    return out;
  };
  const auto compare = [](const Outputs& got, const Outputs& want) {
    const auto first_difference = [](const std::vector<std::uint32_t>& x, const std::vector<std::uint32_t>& y) {
      for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i] != y[i]) return static_cast<long>(i);
      return -1L;
    };
    EXPECT_EQ(first_difference(got.o, want.o), -1) << "O";
    EXPECT_EQ(first_difference(got.lse, want.lse), -1) << "LSE";
    EXPECT_EQ(first_difference(got.dq, want.dq), -1) << "dQ";
    EXPECT_EQ(first_difference(got.dk, want.dk), -1) << "dK";
    EXPECT_EQ(first_difference(got.dv, want.dv), -1) << "dV";
  };
  const Outputs first = run({Backend::serial, 1});
  {
    SCOPED_TRACE("serial x 1, again");
    compare(run({Backend::serial, 1}), first);
  }
  for (const Backend b : test::compiled_backends())
    for (const int threads : {1, 2, 3, 8}) {
      SCOPED_TRACE(std::string(to_string(b)) + " x " + std::to_string(threads));
      compare(run({b, threads}), first);
    }
}

/// The forward in panels (the AMX schedule) gives the same bits for every slab height, with
/// slabs across the query heads of a GQA group, the window, ALiBi, softcap, a bias, a
/// boolean mask and sinks, in one panel and in panels of 64 keys; and is within
/// FlashAttention's rule of the double reference (Bf16ForwardWithinTwiceNaiveBf16 runs the
/// default panels).
TEST(AmxKernels, PanelsGiveTheSameBitsForEverySlabHeight) {
  SKIP_WITHOUT_AMX();
  struct Case {
    std::string name;
    test::ProblemShape shape;
    bool causal;
    index_t window_left;
    float softcap;
    bool alibi, bias, mask;
  };
  const std::vector<Case> cases = {
      {"GQA 8:1, 45 rows a head", {2, 45, 170, 8, 1, 64, 64}, false, -1, 0.0f, false, false, false},
      {"causal, window 50, d 96", {1, 200, 230, 2, 2, 96, 96}, true, 50, 0.0f, false, false, false},
      {"ALiBi and softcap, GQA 4:2", {1, 70, 100, 4, 2, 128, 128}, true, -1, 30.0f, true, false, false},
      {"bias and mask, d 40 / 72", {2, 33, 129, 2, 1, 40, 72}, false, -1, 0.0f, false, true, true}};
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const test::ProblemShape& s = c.shape;
    std::vector<float> slopes(static_cast<std::size_t>(s.heads)), sinks(slopes.size()),
        bias(static_cast<std::size_t>(s.heads * s.seqlen_q * s.seqlen_k));
    for (auto& x : slopes) x = std::uniform_real_distribution<float>(0.01f, 0.5f)(rng);
    for (auto& x : sinks) x = std::normal_distribution<float>()(rng);
    for (auto& x : bias) x = std::normal_distribution<float>()(rng);
    std::unique_ptr<bool[]> mask(new bool[bias.size()]);
    for (std::size_t i = 0; i < bias.size(); ++i) mask[i] = rng() % 4 != 0;
    ForwardOptions opts;
    opts.causal = c.causal;
    opts.window_left = c.window_left;
    opts.softcap = c.softcap;
    opts.sinks = sinks;
    if (c.alibi) opts.alibi_slopes = slopes;
    const index_t nq = s.seqlen_q, nk = s.seqlen_k;
    if (c.bias) opts.bias = {bias.data(), {1, s.heads, nq, nk}, {0, nq * nk, nk, 1}};
    if (c.mask) opts.mask = {mask.get(), {1, s.heads, nq, nk}, {0, nq * nk, nk, 1}};
    opts.sram_budget_bytes = 64 << 20;  // one plan for every slab height: a query tile per head
    for (const index_t panel : {512, 64}) {
      const auto run = [&](index_t slab) {
        arch::tile_slab_rows = slab;
        tileattn::detail::panel_keys = panel;
        test::BackwardProblem<bf16> p(s, 2900);
        p.forward(opts);
        arch::tile_slab_rows = 64;
        tileattn::detail::panel_keys = 0;
        std::vector<std::uint32_t> bits;
        for (const bf16 v : p.o) bits.push_back(v.bits);
        for (const float l : p.lse) bits.push_back(std::bit_cast<std::uint32_t>(l));
        return bits;
      };
      const std::vector<std::uint32_t> want = run(64);
      for (const index_t slab : {32, 16, 7}) {
        const std::vector<std::uint32_t> got = run(slab);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << "panels of " << panel << ", slabs of " << slab << ", element " << i << " of "
                                     << want.size();
      }
    }
  }
}

#else

TEST(AmxSupport, KernelsNotCompiledHere) {
  GTEST_SKIP() << "arch/amx.hpp's kernels are not compiled for this target (they need AVX-512 BF16 on x86-64 "
                  "Linux with GCC or Clang, and no TILEATTN_NO_AMX)";
}

#endif

}  // namespace
}  // namespace tileattn
