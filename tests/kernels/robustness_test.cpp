// tests/kernels/robustness_test.cpp: the forward, backward and paged kernels at the edges of
// their range (docs/reliability.md, "Numerical edge cases"):
//   - scores of magnitude 1e4 (backward, paged decode) and 1e34 (forward, paged), on integer
//     inputs whose dot products are exact in float, so the only error left in O is the
//     scale's rounding into log2 units, which grows with the score (within 2^-21 max|score|
//     of the double reference); the backward's gradients within (2e-5 + 2^-21 max|score|)
//     of their magnitude (P is recomputed from the saved float LSE);
//   - 256k keys at one K/V head (forward, backward, paged decode), checked against the
//     reference on a few rows and keys, with the process's peak memory growing by far less
//     than one score row block of Nq x Nk floats would take (no O(N^2) buffer);
//   - views reaching past 2^31 elements (a batch stride of 2^31 + 5 elements; an 8-bit and a
//     float page pool of more than 2^31 elements with the sequence on its last pages): the
//     same results as the reference. The buffers are allocated but only the elements the
//     views cover are touched, so they cost address space, not memory; where the allocation
//     fails the test is skipped with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <fstream>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "support/backward_support.hpp"
#include "support/paged_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

// ---- Helpers -------------------------------------------------------------------------------

/// Integers in [-range, range] as floats: products and sums of up to 2^24 / range^2 of them
/// are exact in float.
template <class T>
void fill_integers(std::vector<T>& buffer, int range, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(-range, range);
  for (T& x : buffer) x = from_float<T>(static_cast<float>(pick(rng)));
}

/// The process's resident memory now and its peak since the last reset, in bytes (Linux).
std::size_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::string(field).size())) * 1024;
  return 0;
}

/// Runs f() and returns how far the peak resident memory rose above what was resident
/// before (0 where /proc does not tell).
template <class F>
std::size_t peak_growth(F&& f) {
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current VmRSS
  const std::size_t before = status_bytes("VmRSS:");
  f();
  const std::size_t peak = status_bytes("VmHWM:");
  return peak > before ? peak - before : 0;
}

/// The largest |O| of a reference result.
double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// An uninitialised buffer of n elements of T (pages are only committed where written), or
/// nullptr where the allocation fails. malloc, not new T[n]: bf16's default constructor
/// zeroes its bits, and would touch every page. (T is trivially copyable and destructible,
/// so malloc creates its objects implicitly.)
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using HugeBuffer = std::unique_ptr<T[], FreeDeleter>;
template <class T>
HugeBuffer<T> huge_buffer(std::size_t n) {
  return HugeBuffer<T>(static_cast<T*>(std::malloc(n * sizeof(T))));
}

constexpr std::size_t past_int32 = (std::size_t{1} << 31) + 5;  // elements

// ---- Scores of magnitude 1e4 and beyond ------------------------------------------------------

TEST(LargeScores, BackwardGradientsAtScoresNear1e4) {
  // Entries in [-16, 16], d 32: |q.k| <= 8192, exact; scale 4: scores up to ~8e3.
  BackwardProblem<float> p({1, 70, 90, 2, 1, 32, 32}, 11);
  fill_integers(p.q, 16, 1);
  fill_integers(p.k, 16, 2);
  BackwardOptions opts;
  opts.softmax_scale = 4.0f;
  p.forward(opts);
  p.backward(opts);
  double max_score = 0.0;
  for_each_index(p.qv.shape, [&](index_t, index_t i, index_t h, index_t) {
    for (index_t j = 0; j < p.s.seqlen_k; ++j) {
      double s = 0.0;
      for (index_t c = 0; c < p.s.head_dim; ++c) s += double(p.qv(0, i, h, c)) * p.kv(0, j, 0, c);
      max_score = std::max(max_score, std::abs(4.0 * s));
    }
  });
  ASSERT_GT(max_score, 5e3);
  // The backward recomputes P = exp(score - LSE) from the saved float LSE: at scores of size
  // M both carry a rounding of about M 2^-24, so P is off by a relative ~M 2^-23. (A naive
  // float backward, whose integer scores are exact here, does better; FlashAttention's
  // kernels share this.) Bound: 2e-5 (the fp32 suite's) + M 2^-21, relative.
  const auto want = p.reference(reference::Options::from(opts));
  for (const auto& [name, got, ref] : {std::tuple{"dq", p.grad_q(), &want.dq}, std::tuple{"dk", p.grad_k(), &want.dk},
                                       std::tuple{"dv", p.grad_v(), &want.dv}}) {
    const GradError e = grad_error(got, *ref, name);
    EXPECT_EQ(e.problem, "");
    EXPECT_GT(e.magnitude, 0.0) << name << " is all zeros: the check cannot fail";
    EXPECT_LE(e.max_error, (2e-5 + 0x1p-21 * max_score) * e.magnitude) << name << " (magnitude " << e.magnitude << ")";
  }
}

/// A paged decode batch of integer-valued Q and K at this softmax scale, against the reference.
void check_paged_large_scores(float scale, double tolerance_per_score) {
  PagedShape s{{300, 41, 1}, 2, 4, 2, 32, 32, 16, 2};
  PagedBatch<float> batch(s, 5);
  fill_integers(batch.q, 16, 3);
  for (index_t b = 0; b < s.batch(); ++b) {
    auto& k = batch.k_seq[static_cast<std::size_t>(b)];
    fill_integers(k, 16, 10 + static_cast<std::uint64_t>(b));
    for (index_t r = 0; r < s.k_lens[static_cast<std::size_t>(b)]; ++r) {
      const index_t page = batch.table[static_cast<std::size_t>(b * batch.max_pages + r / s.page_size)];
      std::copy_n(&k[static_cast<std::size_t>(r * s.heads_kv * s.head_dim)], s.heads_kv * s.head_dim,
                  &batch.k_pool[static_cast<std::size_t>((page * s.page_size + r % s.page_size) * s.heads_kv * s.head_dim)]);
    }
  }
  PagedOptions opts;
  opts.softmax_scale = scale;
  opts.causal = true;
  batch.run(opts);
  const double max_score = scale * 16.0 * 16.0 * s.head_dim;  // a bound; typical scores are ~30x smaller
  const Deviation d = batch.against_reference(opts);
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.o, tolerance_per_score * max_score + 1e-5);
}

TEST(LargeScores, PagedDecodeAtScoresOf1e4) { check_paged_large_scores(2.0f, 0x1p-21); }

TEST(LargeScores, PagedRowsAreOneHotAtScoresOf1e34) {
  // Score gaps of at least 1e30 (integer dot products differ by 1 or more): every row's
  // softmax is one-hot at its largest score, or split evenly between tied ones, exactly.
  check_paged_large_scores(1e30f, 0.0);
}

TEST(LargeScores, ForwardRowsAreOneHotAtScoresOf1e34) {
  HostTensor q({2, 33, 4, 24}, Layout::bshd), k({2, 70, 2, 24}, Layout::bhsd), v({2, 70, 2, 24}, Layout::bshd),
      o({2, 33, 4, 24}, Layout::bshd);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> pick(-16, 16);
  for (float& x : q.buffer()) x = static_cast<float>(pick(rng));
  for (float& x : k.buffer()) x = static_cast<float>(pick(rng));
  v.fill_normal(8);
  HostLse lse(2, 4, 33);
  ForwardOptions opts;
  opts.softmax_scale = 1e30f;
  opts.causal = true;
  forward(q.cview(), k.cview(), v.cview(), o.view(), lse.view(), opts);
  const auto ref = reference::attention<float>(q.cview(), k.cview(), v.cview(), reference::Options::from(opts));
  const Deviation d = compare_to_reference(ref, o.cview(), LseView{});
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.o, 1e-6 * max_abs(ref.o));
}

// ---- 256k keys, no quadratic memory -----------------------------------------------------------

constexpr index_t long_keys = index_t{1} << 18;
constexpr std::size_t quadratic_bytes = std::size_t{64} * long_keys * sizeof(float);  // 64 rows x 256k scores

TEST(LongKeys, ForwardOver256kKeysMatchesTheReferenceInLinearMemory) {
  HostTensor q({1, 64, 2, 32}, Layout::bshd), k({1, long_keys, 1, 32}, Layout::bshd),
      v({1, long_keys, 1, 32}, Layout::bshd), o({1, 64, 2, 32}, Layout::bshd);
  q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), o.fill(sentinel);
  HostLse lse(1, 2, 64);
  const std::size_t growth = peak_growth([&] { forward(q.cview(), k.cview(), v.cview(), o.view(), lse.view()); });
  EXPECT_LT(growth, quadratic_bytes / 4) << "the forward's peak memory grew by " << growth << " bytes";
  // Rows 0, 21, 42, 63 (no mask, so a subset of rows is a problem of its own).
  const auto rows = [](const TensorView<float>& t) {
    return TensorView<const float>{t.data, {1, 4, t.shape[2], t.shape[3]}, {t.stride[0], 21 * t.stride[1], t.stride[2], t.stride[3]}};
  };
  const auto ref = reference::attention<float>(rows(q.view()), k.cview(), v.cview(), {});
  const LseView lse_rows{lse.view().data, {1, 2, 4}, {lse.view().stride[0], lse.view().stride[1], 21}};
  const Deviation d = compare_to_reference(ref, rows(o.view()), lse_rows);
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.o, 2e-5);
  EXPECT_LE(d.lse, 2e-5);
}

TEST(LongKeys, BackwardOver256kKeysMatchesTheReferenceInLinearMemory) {
  const index_t nq = 64, d = 16;
  BackwardProblem<float> p({1, nq, long_keys, 2, 1, d, d}, 21);
  BackwardOptions opts;
  opts.causal = true;  // bottom-right: the 64 queries are the last 64 positions
  p.forward(opts);
  const std::size_t growth = peak_growth([&] { p.backward(opts); });
  EXPECT_LT(growth, quadratic_bytes / 4) << "the backward's peak memory grew by " << growth << " bytes";
  // dV and dK at a few keys, in double: dV_j = sum_i P_ij dO_i, dK_j = scale sum_i P_ij
  // (dO_i . V_j - dO_i . O_i) Q_i, with O and LSE the forward's (the forward suites check
  // them; a double reference over 256k keys would take half a minute under ASan).
  const double scale = 1.0 / std::sqrt(double(d));
  const index_t offset = long_keys - nq;
  for (index_t j : {index_t{0}, index_t{77777}, long_keys - 40, long_keys - 1}) {
    for (index_t c = 0; c < d; ++c) {
      double dv = 0.0, dk = 0.0;
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < nq; ++i) {
          if (j > i + offset) continue;
          double s = 0.0, dp = 0.0, delta = 0.0;
          for (index_t e = 0; e < d; ++e) {
            s += double(p.qv(0, i, h, e)) * p.kv(0, j, 0, e);
            dp += double(p.dov(0, i, h, e)) * p.vv(0, j, 0, e);
            delta += double(p.dov(0, i, h, e)) * p.ov(0, i, h, e);
          }
          const double prob = std::exp(s * scale - p.lse[static_cast<std::size_t>(h * nq + i)]);
          dv += prob * p.dov(0, i, h, c);
          dk += scale * prob * (dp - delta) * p.qv(0, i, h, c);
        }
      EXPECT_NEAR(p.dvv(0, j, 0, c), dv, 1e-5 + 1e-4 * std::abs(dv)) << "key " << j << " element " << c;
      EXPECT_NEAR(p.dkv(0, j, 0, c), dk, 1e-5 + 1e-4 * std::abs(dk)) << "key " << j << " element " << c;
    }
  }
}

TEST(LongKeys, PagedDecodeOver256kKeysMatchesTheReferenceInLinearMemory) {
  PagedShape s{{long_keys}, 4, 4, 1, 32, 32, 16, 0};
  PagedBatch<float> batch(s, 9);
  PagedOptions opts;
  opts.causal = true;
  const std::size_t growth = peak_growth([&] { batch.run(opts); });
  EXPECT_LT(growth, quadratic_bytes / 4) << "the decode's peak memory grew by " << growth << " bytes";
  const Deviation d = batch.against_reference(opts);
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.o, 2e-5);
  EXPECT_LE(d.lse, 2e-5);
}

// ---- Views past 2^31 elements ---------------------------------------------------------------

/// K and V of two batches, the second 2^31 + 5 elements after the first: [2, nk, hkv, d].
template <class T>
struct FarApart {
  HugeBuffer<T> buffer;
  TensorView<T> view;
  FarApart(index_t nk, index_t hkv, index_t d, std::uint64_t seed) : buffer(huge_buffer<T>(past_int32 + nk * hkv * d)) {
    if (!buffer) return;
    view = {buffer.get(), {2, nk, hkv, d}, {static_cast<index_t>(past_int32), hkv * d, d, 1}};
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for_each_index(view.shape, [&](index_t b, index_t n, index_t h, index_t c) { view(b, n, h, c) = from_float<T>(normal(rng)); });
  }
  /// A compact copy, for the reference.
  std::vector<T> compact() const {
    std::vector<T> out;
    for_each_index(view.shape, [&](index_t b, index_t n, index_t h, index_t c) { out.push_back(view(b, n, h, c)); });
    return out;
  }
};

TEST(IndexSafety, ForwardWithABatchStridePast2To31Elements) {
  FarApart<float> k(45, 2, 16, 1), v(45, 2, 16, 2);
  if (!k.buffer || !v.buffer) GTEST_SKIP() << "could not reserve 2 x 8 GiB of address space";
  HostTensor q({2, 19, 4, 16}, Layout::bshd), o({2, 19, 4, 16}, Layout::bshd);
  q.fill_normal(3), o.fill(sentinel);
  HostLse lse(2, 4, 19);
  ForwardOptions opts;
  opts.causal = true;
  forward(q.cview(), TensorView<const float>(k.view), TensorView<const float>(v.view), o.view(), lse.view(), opts);
  const std::vector<float> kc = k.compact(), vc = v.compact();
  const auto ref = reference::attention<float>(q.cview(), make_bshd(kc.data(), 2, 45, 2, 16), make_bshd(vc.data(), 2, 45, 2, 16),
                                               reference::Options::from(opts));
  const Deviation d = compare_to_reference(ref, o.cview(), lse.view());
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.o, 2e-5);
  EXPECT_LE(d.lse, 2e-5);
}

TEST(IndexSafety, BackwardWithABatchStridePast2To31Elements) {
  using T = bf16;
  FarApart<T> k(37, 1, 8, 1), v(37, 1, 8, 2), dk(37, 1, 8, 3), dv(37, 1, 8, 4);
  if (!k.buffer || !v.buffer || !dk.buffer || !dv.buffer) GTEST_SKIP() << "could not reserve 4 x 4 GiB of address space";
  BackwardProblem<T> p({2, 23, 37, 2, 1, 8, 8}, 5);
  std::copy_n(k.compact().begin(), p.k.size(), p.k.begin());
  std::copy_n(v.compact().begin(), p.v.size(), p.v.begin());
  BackwardOptions opts;
  opts.causal = true;
  p.forward(opts);
  p.backward(opts);  // compact: the expected bits
  backward(TensorView<const T>(p.qv), TensorView<const T>(k.view), TensorView<const T>(v.view), TensorView<const T>(p.ov),
           make_lse(p.lse.data(), 2, 2, 23), TensorView<const T>(p.dov), p.dqv, dk.view, dv.view, opts);
  const auto same = [](const std::vector<T>& a, const std::vector<T>& b) { return std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0; };
  EXPECT_TRUE(same(dk.compact(), p.dk)) << "dK differs from the compact layout's";
  EXPECT_TRUE(same(dv.compact(), p.dv)) << "dV differs from the compact layout's";
  const auto want = p.reference(reference::Options::from(opts));
  const GradError e = grad_error(p.grad_k(), want.dk, "dk");
  EXPECT_LE(e.max_error, 0.05 * e.magnitude + 1e-3);
}

/// A decode over a page pool of more than 2^31 elements of KV, its sequence on the last pages.
template <class KV>
void check_paged_past_int32() {
  const index_t page = 16, hkv = 1, d = 64, len = 40, pages_used = 3;
  const index_t num_pages = static_cast<index_t>(past_int32 / (page * hkv * d)) + pages_used;
  const auto elements = static_cast<std::size_t>(num_pages * page * hkv * d);
  auto k_pool = huge_buffer<KV>(elements), v_pool = huge_buffer<KV>(elements);
  if (!k_pool || !v_pool) GTEST_SKIP() << "could not reserve 2 x " << elements * sizeof(KV) << " bytes of address space";
  std::vector<float> k_seq(static_cast<std::size_t>(len * d)), v_seq(k_seq.size()), q(4 * d), o(4 * d, sentinel), lse(4, sentinel);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (auto* x : {&k_seq, &v_seq, &q})
    for (float& e : *x) e = normal(rng);
  const std::vector<std::int32_t> table{static_cast<std::int32_t>(num_pages - 1), static_cast<std::int32_t>(num_pages - 3),
                                        static_cast<std::int32_t>(num_pages - 2)};
  // int8 values up to 127 / 32 ~ 4: N(0, 1) data fits.
  std::vector<float> scales(static_cast<std::size_t>(num_pages), 1.0f / 32);
  for (index_t r = 0; r < len; ++r) {
    const auto p = static_cast<std::size_t>(table[static_cast<std::size_t>(r / page)]);
    for (index_t c = 0; c < d; ++c) {
      const auto at = (p * page + static_cast<std::size_t>(r % page)) * d + static_cast<std::size_t>(c);
      const auto from = static_cast<std::size_t>(r * d + c);
      if constexpr (quantized_type<KV>) {
        k_pool[at] = quantize<KV>(k_seq[from], scales[p]), v_pool[at] = quantize<KV>(v_seq[from], scales[p]);
        k_seq[from] = dequantize(k_pool[at], scales[p]), v_seq[from] = dequantize(v_pool[at], scales[p]);
      } else {
        k_pool[at] = k_seq[from], v_pool[at] = v_seq[from];
      }
    }
  }
  const std::vector<std::int32_t> seqlens{static_cast<std::int32_t>(len)};
  PagedOptions opts;
  if constexpr (quantized_type<KV>) {
    const KvScaleView sv{scales.data(), {num_pages, 1}, {1, 0}};
    opts.k_scale = sv, opts.v_scale = sv;
  }
  forward_paged(make_bshd<const float>(q.data(), 1, 1, 4, d), make_bshd<const KV>(k_pool.get(), num_pages, page, hkv, d),
                make_bshd<const KV>(v_pool.get(), num_pages, page, hkv, d), make_block_table(table.data(), 1, pages_used),
                seqlens, make_bshd(o.data(), 1, 1, 4, d), make_lse(lse.data(), 1, 4, 1), opts);
  const auto ref = reference::attention<float>(make_bshd<const float>(q.data(), 1, 1, 4, d), make_bshd<const float>(k_seq.data(), 1, len, 1, d),
                                               make_bshd<const float>(v_seq.data(), 1, len, 1, d), reference::Options::from(opts));
  const Deviation dev = compare_to_reference(ref, make_bshd<const float>(o.data(), 1, 1, 4, d), make_lse(lse.data(), 1, 4, 1));
  EXPECT_EQ(dev.problem, "");
  EXPECT_LE(dev.o, 2e-5);
  EXPECT_LE(dev.lse, 2e-5);
}

TEST(IndexSafety, Int8PagePoolPast2To31Elements) { check_paged_past_int32<std::int8_t>(); }
TEST(IndexSafety, FloatPagePoolPast2To31Elements) { check_paged_past_int32<float>(); }

}  // namespace
}  // namespace tileattn::test
