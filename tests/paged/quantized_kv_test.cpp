// tests/paged/quantized_kv_test.cpp: attention over 8-bit K/V (fp8 e4m3, fp8 e5m2, int8 with
// scales): the contiguous forward and forward_paged against the double reference over the
// dequantized K/V (FlashAttention's fp32 bound), and bitwise equal to the same kernels over
// the dequantized K/V stored in float when the scales are powers of two (scaling is then
// exact, so folding the scales into scores and probabilities must change no bit); KvCache
// and write_kv_slots quantizing on write (int8 scales growing per page, requantization
// bounded, copy-on-write copying scales); and bad scales rejected with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/expect_throw_naming.hpp"
#include "support/test_support.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/paged.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

/// Random 8-bit K or V of `count` heads-rows: values N(0, 1) quantized at the scale of their
/// (block, head); `deq` receives each value dequantized (exact in float).
template <class Q>
struct Quantized {
  std::vector<Q> data;
  std::vector<float> deq;
};

/// A scale for values of magnitude up to ~4: the format's range used, as a server would
/// calibrate it (int8: absmax / 127; fp8: 4 / max_finite), times `jitter`; or a power of two.
template <class Q>
float natural_scale(float jitter, bool power_of_two) {
  float s = jitter;  // fp8: range enough for N(0, 1) at scales near 1
  if constexpr (std::is_same_v<Q, std::int8_t>) s = 4.0f / int8_max * jitter;
  return power_of_two ? std::exp2(std::round(std::log2(s))) : s;
}

template <class Q>
Q q_from(float x, float scale) {
  return quantize<Q>(x, scale);
}

/// One contiguous case: Q in T, K/V in Q8, scales [B, Hkv] for K and V.
template <class T, class Q8>
struct ContiguousCase {
  index_t B, N, Nk, H, Hkv, D;
  std::vector<T> q;
  std::vector<Q8> k, v;
  std::vector<float> kd, vd, ks, vs, qf;  // dequantized K/V, scales, Q as float

  ContiguousCase(index_t b, index_t n, index_t nk, index_t h, index_t hkv, index_t d, bool pow2, std::uint64_t seed)
      : B(b), N(n), Nk(nk), H(h), Hkv(hkv), D(d) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> jitter(0.6f, 1.7f);
    for (index_t i = 0; i < B * Hkv; ++i) {
      ks.push_back(natural_scale<Q8>(jitter(rng), pow2));
      vs.push_back(natural_scale<Q8>(jitter(rng), pow2));
    }
    q.resize(static_cast<std::size_t>(B * N * H * D));
    for (auto& x : q) x = from_float<T>(normal(rng));
    for (auto& x : q) qf.push_back(to_float(x));
    const std::size_t kv = static_cast<std::size_t>(B * Nk * Hkv * D);
    k.resize(kv);
    v.resize(kv);
    kd.resize(kv);
    vd.resize(kv);
    for (std::size_t i = 0; i < kv; ++i) {
      const auto bh = static_cast<std::size_t>((i / static_cast<std::size_t>(Nk * Hkv * D)) * Hkv +
                                               (i / static_cast<std::size_t>(D)) % Hkv);
      k[i] = q_from<Q8>(normal(rng), ks[bh]);
      v[i] = q_from<Q8>(normal(rng), vs[bh]);
      kd[i] = to_float(k[i]) * ks[bh];
      vd[i] = to_float(v[i]) * vs[bh];
    }
  }
  ForwardOptions options(bool causal) const {
    ForwardOptions o;
    o.causal = causal;
    o.k_scale = {ks.data(), {B, Hkv}, {Hkv, 1}};
    o.v_scale = {vs.data(), {B, Hkv}, {Hkv, 1}};
    return o;
  }
  std::vector<T> run(const ForwardOptions& opt, std::vector<float>* lse = nullptr) const {
    std::vector<T> o(static_cast<std::size_t>(B * N * H * D), from_float<T>(sentinel));
    std::vector<float> l(static_cast<std::size_t>(B * H * N), sentinel);
    forward(make_bshd(q.data(), B, N, H, D), make_bshd(k.data(), B, Nk, Hkv, D), make_bshd(v.data(), B, Nk, Hkv, D),
            make_bshd(o.data(), B, N, H, D), make_lse(l.data(), B, H, N), opt);
    if (lse) *lse = l;
    return o;
  }
};

template <class T>
std::vector<float> as_floats(const std::vector<T>& x) {
  std::vector<float> out;
  for (const T& e : x) out.push_back(to_float(e));
  return out;
}

template <class Q8>
void check_contiguous_against_reference() {
  struct Shape { index_t b, n, nk, h, hkv, d; bool causal; };
  for (const Shape s : {Shape{2, 1, 1, 4, 2, 64, false}, Shape{1, 17, 17, 8, 2, 80, true},
                        Shape{2, 127, 300, 4, 1, 33, false}, Shape{1, 1, 1000, 8, 2, 128, false},
                        Shape{1, 300, 300, 2, 2, 64, true}}) {
    const ContiguousCase<float, Q8> c(s.b, s.n, s.nk, s.h, s.hkv, s.d, false, 7 + static_cast<std::uint64_t>(s.n));
    const ForwardOptions opt = c.options(s.causal);
    std::vector<float> lse;
    const auto o = c.run(opt, &lse);
    const auto ref = reference::attention(make_bshd<const float>(c.qf.data(), s.b, s.n, s.h, s.d),
                                          make_bshd<const float>(c.kd.data(), s.b, s.nk, s.hkv, s.d),
                                          make_bshd<const float>(c.vd.data(), s.b, s.nk, s.hkv, s.d),
                                          default_scale(s.d), s.causal);
    const Deviation d = compare_to_reference(ref, make_bshd<const float>(o.data(), s.b, s.n, s.h, s.d),
                                             make_lse(lse.data(), s.b, s.h, s.n));
    SCOPED_TRACE(std::string(kv_type_name<Q8>()) + " N " + std::to_string(s.n) + " Nk " + std::to_string(s.nk));
    EXPECT_TRUE(d.problem.empty()) << d.problem;
    EXPECT_LE(d.o, forward_o_tolerance);
    EXPECT_LE(d.lse, forward_lse_tolerance);
  }
}

TEST(QuantizedForward, Int8MatchesReferenceOverDequantizedKv) { check_contiguous_against_reference<std::int8_t>(); }
TEST(QuantizedForward, E4m3MatchesReferenceOverDequantizedKv) { check_contiguous_against_reference<fp8_e4m3>(); }
TEST(QuantizedForward, E5m2MatchesReferenceOverDequantizedKv) { check_contiguous_against_reference<fp8_e5m2>(); }

/// With power-of-two scales, 8-bit K/V must give the bits of the same forward over the
/// dequantized K/V in float: both the packed path (long queries) and the in-place one
/// (decode-shaped), GQA, causal or not.
template <class Q8>
void check_bitwise_against_float_kv() {
  struct Shape { index_t b, n, nk, h, hkv, d; bool causal; };
  for (const Shape s : {Shape{2, 1, 517, 8, 2, 128, false}, Shape{1, 3, 64, 4, 1, 17, true},
                        Shape{1, 200, 333, 4, 2, 64, true}, Shape{3, 40, 40, 2, 2, 96, false}}) {
    const ContiguousCase<float, Q8> c(s.b, s.n, s.nk, s.h, s.hkv, s.d, true, 11);
    const auto o8 = c.run(c.options(s.causal));
    std::vector<float> o32(o8.size(), sentinel);
    ForwardOptions plain;
    plain.causal = s.causal;
    forward(make_bshd(c.q.data(), s.b, s.n, s.h, s.d), make_bshd(c.kd.data(), s.b, s.nk, s.hkv, s.d),
            make_bshd(c.vd.data(), s.b, s.nk, s.hkv, s.d), make_bshd(o32.data(), s.b, s.n, s.h, s.d), plain);
    EXPECT_TRUE(bitwise_equal(o8, o32)) << kv_type_name<Q8>() << " N " << s.n << " Nk " << s.nk;
  }
}

TEST(QuantizedForward, Int8PowerOfTwoScalesBitwiseAsFloatKv) { check_bitwise_against_float_kv<std::int8_t>(); }
TEST(QuantizedForward, E4m3PowerOfTwoScalesBitwiseAsFloatKv) { check_bitwise_against_float_kv<fp8_e4m3>(); }
TEST(QuantizedForward, E5m2PowerOfTwoScalesBitwiseAsFloatKv) { check_bitwise_against_float_kv<fp8_e5m2>(); }

/// bf16 queries over 8-bit K/V: FlashAttention's rule against the naive bf16 error, measured
/// as the error of the same kernel over K/V dequantized to bf16 (exact for power-of-two
/// scales): at most 2x that + 1e-3... and against the reference directly.
template <class Q8>
void check_bf16_queries() {
  for (const index_t n : {index_t{1}, index_t{17}, index_t{200}}) {
    const ContiguousCase<bf16, Q8> c(2, n, 300, 8, 2, 64, true, 5);
    const auto o8 = as_floats(c.run(c.options(true)));
    std::vector<bf16> kb, vb;
    for (float x : c.kd) kb.push_back(bf16(x));
    for (float x : c.vd) vb.push_back(bf16(x));
    std::vector<bf16> ob(o8.size());
    ForwardOptions plain;
    plain.causal = true;
    forward(make_bshd(c.q.data(), 2, n, 8, 64), make_bshd(kb.data(), 2, 300, 2, 64), make_bshd(vb.data(), 2, 300, 2, 64),
            make_bshd(ob.data(), 2, n, 8, 64), plain);
    const auto ref = reference::attention(make_bshd<const float>(c.qf.data(), 2, n, 8, 64),
                                          make_bshd<const float>(c.kd.data(), 2, 300, 2, 64),
                                          make_bshd<const float>(c.vd.data(), 2, 300, 2, 64), default_scale(64), true);
    double err8 = 0, err16 = 0;
    const auto obf = as_floats(ob);
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < n; ++i)
        for (index_t h = 0; h < 8; ++h)
          for (index_t d = 0; d < 64; ++d) {
            const auto at = static_cast<std::size_t>(((b * n + i) * 8 + h) * 64 + d);
            err8 = std::max(err8, std::abs(o8[at] - ref.out(b, i, h, d)));
            err16 = std::max(err16, std::abs(obf[at] - ref.out(b, i, h, d)));
          }
    EXPECT_LE(err8, 2 * err16 + 1e-5) << kv_type_name<Q8>() << " n " << n << " (bf16 K/V: " << err16 << ")";
    EXPECT_GT(err16, 0.0);  // the comparison is not vacuous
  }
}

TEST(QuantizedForward, Bf16QueriesInt8) { check_bf16_queries<std::int8_t>(); }
TEST(QuantizedForward, Bf16QueriesE4m3) { check_bf16_queries<fp8_e4m3>(); }

/// Scales broadcast: [1, 1] (per tensor) and [1, Hkv] (per head) equal the full [B, Hkv].
TEST(QuantizedForward, BroadcastScales) {
  ContiguousCase<float, std::int8_t> c(3, 9, 50, 4, 2, 32, false, 3);
  for (float& s : c.ks) s = c.ks[0];
  for (float& s : c.vs) s = c.vs[1];
  const auto full = c.run(c.options(false));
  ForwardOptions opt = c.options(false);
  opt.k_scale = per_tensor_scale(&c.ks[0]);
  opt.v_scale = {&c.vs[1], {1, 2}, {0, 0}};
  EXPECT_TRUE(bitwise_equal(as_floats(full), as_floats(c.run(opt))));
}

/// A NaN among int8 K (stored as int8_nan) makes exactly the rows that see it NaN.
TEST(QuantizedForward, NonFiniteValuesReachOnlyTheRowsThatSeeThem) {
  ContiguousCase<float, std::int8_t> c(1, 8, 8, 2, 1, 16, false, 9);
  c.v[static_cast<std::size_t>(5 * 16 + 3)] = int8_nan;  // key 5's value
  const auto o = c.run(c.options(true));
  for (index_t i = 0; i < 8; ++i)
    for (index_t h = 0; h < 2; ++h) {
      const float x = o[static_cast<std::size_t>((i * 2 + h) * 16 + 3)];
      EXPECT_EQ(std::isnan(x), i >= 5) << "query " << i;
      EXPECT_FALSE(std::isnan(o[static_cast<std::size_t>((i * 2 + h) * 16 + 4)]) && i < 5);
    }
  ContiguousCase<float, fp8_e4m3> f(1, 8, 8, 2, 1, 16, false, 9);
  f.k[static_cast<std::size_t>(6 * 16)] = fp8_e4m3::from_bits(0x7f);  // NaN key 6
  const auto of = f.run(f.options(true));
  for (index_t i = 0; i < 8; ++i) EXPECT_EQ(std::isnan(of[static_cast<std::size_t>(i * 2 * 16)]), i >= 6);
}

TEST(QuantizedForward, RejectsBadScales) {
  const ContiguousCase<float, std::int8_t> c(2, 4, 4, 2, 2, 16, false, 1);
  const std::vector<float> k32(c.kd);
  std::vector<float> o(static_cast<std::size_t>(2 * 4 * 2 * 16), sentinel);
  const auto out = make_bshd(o.data(), 2, 4, 2, 16);
  ForwardOptions opt = c.options(false);
  // Scales on float K/V.
  EXPECT_THROW_NAMING(forward(make_bshd(c.qf.data(), 2, 4, 2, 16), make_bshd(k32.data(), 2, 4, 2, 16),
                              make_bshd(k32.data(), 2, 4, 2, 16), out, opt),
                      "k_scale");
  // Wrong extents.
  opt.k_scale = {c.ks.data(), {3, 2}, {2, 1}};
  EXPECT_THROW_NAMING(forward(make_bshd(c.q.data(), 2, 4, 2, 16), make_bshd(c.k.data(), 2, 4, 2, 16),
                              make_bshd(c.v.data(), 2, 4, 2, 16), out, opt),
                      "k_scale.shape[0] (batch)");
  opt = c.options(false);
  opt.v_scale = {c.vs.data(), {2, 3}, {3, 1}};
  EXPECT_THROW_NAMING(forward(make_bshd(c.q.data(), 2, 4, 2, 16), make_bshd(c.k.data(), 2, 4, 2, 16),
                              make_bshd(c.v.data(), 2, 4, 2, 16), out, opt),
                      "v_scale.shape[1] (heads_kv)");
  // Output over the scales.
  opt = c.options(false);
  opt.v_scale = {o.data(), {2, 2}, {2, 1}};
  EXPECT_THROW_NAMING(forward(make_bshd(c.q.data(), 2, 4, 2, 16), make_bshd(c.k.data(), 2, 4, 2, 16),
                              make_bshd(c.v.data(), 2, 4, 2, 16), out, opt),
                      "o");
  for (float x : o) ASSERT_EQ(x, sentinel);
}

// ---- Paged -------------------------------------------------------------------------------

/// A paged batch of 8-bit K/V: shuffled pages, per-(page, head) scales (int8's layout; fp8
/// too, which the kernel takes the same way), poisoned unused pages and scales.
template <class Q8>
struct QuantizedPagedBatch {
  index_t B, q_len, H, Hkv, D, P, num_pages = 0, max_pages = 0;
  std::vector<index_t> lens;
  std::vector<float> q, o, lse, ks, vs;                 // scales [num_pages, Hkv]
  std::vector<Q8> k_pool, v_pool;
  std::vector<std::vector<float>> kd, vd;               // per sequence, dequantized [len, Hkv, D]
  std::vector<std::int32_t> table, seqlens;

  QuantizedPagedBatch(std::vector<index_t> k_lens, index_t ql, index_t h, index_t hkv, index_t d, index_t p,
                      bool pow2, std::uint64_t seed)
      : B(static_cast<index_t>(k_lens.size())), q_len(ql), H(h), Hkv(hkv), D(d), P(p), lens(std::move(k_lens)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> jitter(0.6f, 1.7f);
    for (index_t len : lens) {
      num_pages += (len + P - 1) / P;
      max_pages = std::max(max_pages, (len + P - 1) / P);
    }
    num_pages += 2;  // spare pages, poisoned
    max_pages += 1;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ks.assign(static_cast<std::size_t>(num_pages * Hkv), nan);
    vs.assign(static_cast<std::size_t>(num_pages * Hkv), nan);
    k_pool.assign(static_cast<std::size_t>(num_pages * P * Hkv * D), quantize<Q8>(nan, 1.0f));
    v_pool = k_pool;
    table.assign(static_cast<std::size_t>(B * max_pages), std::int32_t{1} << 30);
    std::size_t next = 0;
    for (index_t b = 0; b < B; ++b) {
      const index_t len = lens[static_cast<std::size_t>(b)];
      seqlens.push_back(static_cast<std::int32_t>(len));
      auto& kb = kd.emplace_back(static_cast<std::size_t>(len * Hkv * D));
      auto& vb = vd.emplace_back(static_cast<std::size_t>(len * Hkv * D));
      for (index_t j = 0; j * P < len; ++j) {
        const std::int32_t page = order[next++];
        table[static_cast<std::size_t>(b * max_pages + j)] = page;
        for (index_t hh = 0; hh < Hkv; ++hh) {
          ks[static_cast<std::size_t>(page * Hkv + hh)] = natural_scale<Q8>(jitter(rng), pow2);
          vs[static_cast<std::size_t>(page * Hkv + hh)] = natural_scale<Q8>(jitter(rng), pow2);
        }
      }
      for (index_t r = 0; r < len; ++r) {
        const std::int32_t page = table[static_cast<std::size_t>(b * max_pages + r / P)];
        for (index_t hh = 0; hh < Hkv; ++hh)
          for (index_t c = 0; c < D; ++c) {
            const auto at = static_cast<std::size_t>(((page * P + r % P) * Hkv + hh) * D + c);
            const auto seq_at = static_cast<std::size_t>((r * Hkv + hh) * D + c);
            const float sk = ks[static_cast<std::size_t>(page * Hkv + hh)], sv = vs[static_cast<std::size_t>(page * Hkv + hh)];
            k_pool[at] = quantize<Q8>(normal(rng), sk);
            v_pool[at] = quantize<Q8>(normal(rng), sv);
            kb[seq_at] = to_float(k_pool[at]) * sk;
            vb[seq_at] = to_float(v_pool[at]) * sv;
          }
      }
    }
    q.resize(static_cast<std::size_t>(B * q_len * H * D));
    for (auto& x : q) x = normal(rng);
    o.assign(static_cast<std::size_t>(B * q_len * H * D), sentinel);
    lse.assign(static_cast<std::size_t>(B * H * q_len), sentinel);
  }

  PagedOptions options(bool causal, index_t splits = 0) const {
    PagedOptions opt;
    opt.causal = causal;
    opt.num_splits = splits;
    opt.k_scale = {ks.data(), {num_pages, Hkv}, {Hkv, 1}};
    opt.v_scale = {vs.data(), {num_pages, Hkv}, {Hkv, 1}};
    return opt;
  }
  void run(const PagedOptions& opt) {
    forward_paged(make_bshd<const float>(q.data(), B, q_len, H, D), make_bshd<const Q8>(k_pool.data(), num_pages, P, Hkv, D),
                  make_bshd<const Q8>(v_pool.data(), num_pages, P, Hkv, D), make_block_table(table.data(), B, max_pages),
                  seqlens, make_bshd(o.data(), B, q_len, H, D), make_lse(lse.data(), B, H, q_len), opt);
  }
  Deviation against_reference(bool causal) const {
    Deviation worst;
    for (index_t b = 0; b < B; ++b) {
      const index_t len = lens[static_cast<std::size_t>(b)];
      const auto ref = reference::attention(
          make_bshd<const float>(q.data() + b * q_len * H * D, 1, q_len, H, D),
          make_bshd<const float>(kd[static_cast<std::size_t>(b)].data(), 1, len, Hkv, D),
          make_bshd<const float>(vd[static_cast<std::size_t>(b)].data(), 1, len, Hkv, D), default_scale(D), causal);
      std::vector<float> lse_b(lse.begin() + b * H * q_len, lse.begin() + (b + 1) * H * q_len);
      const Deviation d = compare_to_reference(ref, make_bshd<const float>(o.data() + b * q_len * H * D, 1, q_len, H, D),
                                               make_lse(lse_b.data(), 1, H, q_len));
      worst.o = std::max(worst.o, d.o);
      worst.lse = std::max(worst.lse, d.lse);
      if (worst.problem.empty()) worst.problem = d.problem;
    }
    return worst;
  }
};

template <class Q8>
void check_paged_against_reference() {
  struct Case { std::vector<index_t> lens; index_t q_len, h, hkv, d, page; bool causal; index_t splits; };
  for (const Case& c : {Case{{1, 17, 127, 0, 300}, 1, 8, 2, 64, 16, false, 0},   // decode, with an empty sequence
                        Case{{1000}, 1, 8, 1, 128, 16, false, 0},               // split-KV
                        Case{{40, 33}, 4, 4, 2, 80, 5, true, 0},                // speculative verify
                        Case{{300, 129}, 64, 2, 2, 33, 17, true, 0},            // chunked prefill (packed path)
                        Case{{700}, 2, 4, 4, 64, 3, true, 3}}) {                // forced split, page size 3
    QuantizedPagedBatch<Q8> batch(c.lens, c.q_len, c.h, c.hkv, c.d, c.page, false, 21);
    batch.run(batch.options(c.causal, c.splits));
    const Deviation d = batch.against_reference(c.causal);
    SCOPED_TRACE(std::string(kv_type_name<Q8>()) + " q_len " + std::to_string(c.q_len) + " page " + std::to_string(c.page));
    EXPECT_TRUE(d.problem.empty()) << d.problem;
    EXPECT_LE(d.o, forward_o_tolerance);
    EXPECT_LE(d.lse, forward_lse_tolerance);
  }
}

TEST(QuantizedPaged, Int8MatchesReferenceOverDequantizedCache) { check_paged_against_reference<std::int8_t>(); }
TEST(QuantizedPaged, E4m3MatchesReferenceOverDequantizedCache) { check_paged_against_reference<fp8_e4m3>(); }
TEST(QuantizedPaged, E5m2MatchesReferenceOverDequantizedCache) { check_paged_against_reference<fp8_e5m2>(); }

/// Power-of-two scales per page: bitwise the paged kernel over the dequantized pool in float.
TEST(QuantizedPaged, PowerOfTwoScalesBitwiseAsFloatPool) {
  for (const index_t q_len : {index_t{1}, index_t{3}, index_t{40}}) {
    QuantizedPagedBatch<std::int8_t> batch({77, 300, 5}, q_len, 8, 2, 64, 16, true, 4);
    batch.run(batch.options(true));
    std::vector<float> k32(batch.k_pool.size()), v32(batch.v_pool.size()), o32(batch.o.size(), sentinel);
    for (std::size_t i = 0; i < k32.size(); ++i) {
      const auto page_head = (i / (16 * 2 * 64)) * 2 + (i / 64) % 2;
      const float sk = batch.ks[page_head], sv = batch.vs[page_head];
      k32[i] = to_float(batch.k_pool[i]) * sk;
      v32[i] = to_float(batch.v_pool[i]) * sv;
    }
    PagedOptions plain;
    plain.causal = true;
    forward_paged(make_bshd<const float>(batch.q.data(), 3, q_len, 8, 64),
                  make_bshd<const float>(k32.data(), batch.num_pages, 16, 2, 64),
                  make_bshd<const float>(v32.data(), batch.num_pages, 16, 2, 64),
                  make_block_table(batch.table.data(), 3, batch.max_pages), batch.seqlens,
                  make_bshd(o32.data(), 3, q_len, 8, 64), plain);
    EXPECT_TRUE(bitwise_equal(batch.o, o32)) << "q_len " << q_len;
  }
}

/// Threads and backends do not change a bit (split-KV included).
TEST(QuantizedPaged, BitwiseAcrossBackendsAndThreads) {
  QuantizedPagedBatch<fp8_e4m3> batch({2000, 31}, 1, 8, 2, 128, 16, false, 8);
  batch.run(batch.options(false));
  const auto first = batch.o;
  for (Backend backend : compiled_backends())
    for (int threads : {1, 2, 3}) {
      PagedOptions opt = batch.options(false);
      opt.execution = {backend, threads};
      std::fill(batch.o.begin(), batch.o.end(), sentinel);
      batch.run(opt);
      EXPECT_TRUE(bitwise_equal(first, batch.o)) << to_string(backend) << " x " << threads;
    }
}

/// A NaN value scale on one page (keys 80-95) reaches exactly the rows that see the page, with
/// bf16 queries over 200 rows of a causal prefill: the packed path, in slabs of rows where the
/// micro-kernels take panels (a slab that sees only a panel's first keys must still learn
/// that a later key's scale is not finite, or 0 x NaN poisons its masked keys).
TEST(QuantizedPaged, NonFiniteValueScaleReachesOnlyTheRowsThatSeeItsPage) {
  QuantizedPagedBatch<std::int8_t> batch({200}, 200, 1, 1, 64, 16, false, 12);
  batch.vs[static_cast<std::size_t>(batch.table[5])] = std::numeric_limits<float>::quiet_NaN();  // page 5: keys 80-95
  std::vector<bf16> q(batch.q.size()), o(batch.q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = bf16(batch.q[i]);
  for (const int threads : {1, 2}) {  // one query tile of 200 rows, and tiles split for two workers
    PagedOptions opt = batch.options(true);
    opt.execution = {Backend::serial, threads};
    forward_paged(make_bshd<const bf16>(q.data(), 1, 200, 1, 64),
                  make_bshd<const std::int8_t>(batch.k_pool.data(), batch.num_pages, 16, 1, 64),
                  make_bshd<const std::int8_t>(batch.v_pool.data(), batch.num_pages, 16, 1, 64),
                  make_block_table(batch.table.data(), 1, batch.max_pages), batch.seqlens, make_bshd(o.data(), 1, 200, 1, 64),
                  opt);
    for (index_t i = 0; i < 200; ++i)
      ASSERT_EQ(std::isnan(to_float(o[static_cast<std::size_t>(i * 64 + 7)])), i >= 80)
          << "query " << i << ", " << threads << " threads";
  }
}

TEST(QuantizedPaged, RejectsBadScales) {
  QuantizedPagedBatch<std::int8_t> batch({20}, 1, 2, 1, 16, 4, false, 2);
  PagedOptions opt = batch.options(false);
  opt.k_scale.shape[0] = batch.num_pages + 1;
  EXPECT_THROW_NAMING(batch.run(opt), "k_scale.shape[0] (num_pages)");
  opt = batch.options(false);
  opt.v_scale.data = nullptr;  // allowed: scale 1
  EXPECT_NO_THROW(batch.run(opt));
  std::fill(batch.o.begin(), batch.o.end(), sentinel);
  opt = batch.options(false);
  opt.k_scale = {batch.o.data(), {1, 1}, {0, 0}};
  EXPECT_THROW_NAMING(batch.run(opt), "o");
  for (float x : batch.o) ASSERT_EQ(x, sentinel);
}

// ---- Writing: write_kv_slots and KvCache -----------------------------------------------------

/// int8 scales grow per (page, head): after writing tokens one by one, each page's scale is
/// its largest magnitude / 127, and every value is within one scale of its input (half a
/// scale when nothing raised the scale after it was written).
TEST(QuantizedWrite, Int8ScalesGrowPerPageAndRequantizationIsBounded) {
  const index_t pages = 4, P = 8, Hkv = 2, D = 16, tokens = 3 * P + 5;
  std::vector<std::int8_t> kp(static_cast<std::size_t>(pages * P * Hkv * D)), vp(kp.size());
  std::vector<float> ks(static_cast<std::size_t>(pages * Hkv), 0.0f), vs(ks.size(), 0.0f);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<std::size_t>(tokens * Hkv * D)), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = normal(rng) * (1.0f + static_cast<float>(i % 97) / 10.0f);  // magnitudes that grow and fall
    v[i] = normal(rng);
  }
  std::vector<float> scale_when_written(static_cast<std::size_t>(tokens * Hkv));
  for (index_t t = 0; t < tokens; ++t) {
    const std::int64_t slot = ((t / P + 1) % pages) * P + t % P;  // pages 1, 2, 3, 0
    write_kv_slots(make_thd<const float>(k.data() + t * Hkv * D, 1, Hkv, D), make_thd<const float>(v.data() + t * Hkv * D, 1, Hkv, D),
                   make_page_pool(kp.data(), pages, P, Hkv, D), make_page_pool(vp.data(), pages, P, Hkv, D),
                   std::span<const std::int64_t>(&slot, 1), make_page_scales(ks.data(), pages, Hkv),
                   make_page_scales(vs.data(), pages, Hkv));
    for (index_t h = 0; h < Hkv; ++h)
      scale_when_written[static_cast<std::size_t>(t * Hkv + h)] = ks[static_cast<std::size_t>(slot / P * Hkv + h)];
  }
  for (index_t t = 0; t < tokens; ++t) {
    const index_t page = (t / P + 1) % pages, row = t % P;
    for (index_t h = 0; h < Hkv; ++h) {
      const float s = ks[static_cast<std::size_t>(page * Hkv + h)];
      float absmax = 0;
      for (index_t u = t / P * P; u < std::min(tokens, t / P * P + P); ++u)
        for (index_t c = 0; c < D; ++c) absmax = std::max(absmax, std::abs(k[static_cast<std::size_t>((u * Hkv + h) * D + c)]));
      ASSERT_FLOAT_EQ(s, absmax / int8_max) << "page " << page << " head " << h;
      const bool raised_later = s != scale_when_written[static_cast<std::size_t>(t * Hkv + h)];
      for (index_t c = 0; c < D; ++c) {
        const float x = k[static_cast<std::size_t>((t * Hkv + h) * D + c)];
        const float got = to_float(kp[static_cast<std::size_t>(((page * P + row) * Hkv + h) * D + c)]) * s;
        EXPECT_LE(std::abs(got - x), (raised_later ? 1.0f : 0.5f) * s * 1.0001f) << "token " << t;
      }
    }
  }
}

TEST(QuantizedWrite, RejectsBadScalesAndWritesNothing) {
  const index_t pages = 2, P = 4, Hkv = 1, D = 8;
  std::vector<std::int8_t> kp(static_cast<std::size_t>(pages * P * Hkv * D), 7), vp(kp);
  std::vector<float> ks{0.0f, 0.0f}, vs{0.0f, -1.0f}, rows(static_cast<std::size_t>(Hkv * D), 1.0f);
  const std::int64_t slot = P;  // page 1
  const auto write = [&](PageScaleView k_scale, PageScaleView v_scale) {
    write_kv_slots(make_thd<const float>(rows.data(), 1, Hkv, D), make_thd<const float>(rows.data(), 1, Hkv, D),
                   make_page_pool(kp.data(), pages, P, Hkv, D), make_page_pool(vp.data(), pages, P, Hkv, D),
                   std::span<const std::int64_t>(&slot, 1), k_scale, v_scale);
  };
  EXPECT_THROW_NAMING(write(make_page_scales(ks.data(), pages, Hkv), make_page_scales(vs.data(), pages, Hkv)), "v_scale");
  EXPECT_THROW_NAMING(write({ks.data(), {1, 1}, {0, 0}}, make_page_scales(ks.data() + 1, 1, 1)), "k_scale.shape[0] (num_pages)");
  for (auto x : kp) ASSERT_EQ(x, 7);
  for (auto x : vp) ASSERT_EQ(x, 7);
  EXPECT_EQ(ks[1], 0.0f);
  // Issue 27: int8 scales are written while slot_mapping is read (N1), and both pools are
  // written (N2): neither may overlap.
  std::vector<float> held(4, 0.0f), v_held(2, 0.0f);  // K scales in held[1, 3), the slot (aligned) in [2, 4)
  std::memcpy(held.data() + 2, &slot, sizeof slot);  // over the K scale of page 1
  const auto* slot_in_scales = reinterpret_cast<const std::int64_t*>(held.data() + 2);
  const auto rows_view = make_thd<const float>(rows.data(), 1, Hkv, D);
  EXPECT_THROW_NAMING(write_kv_slots(rows_view, rows_view, make_page_pool(kp.data(), pages, P, Hkv, D),
                                     make_page_pool(vp.data(), pages, P, Hkv, D), std::span<const std::int64_t>(slot_in_scales, 1),
                                     make_page_scales(held.data() + 1, pages, Hkv), make_page_scales(v_held.data(), pages, Hkv)),
                      "k_scale");
  EXPECT_THROW_NAMING(write_kv_slots(rows_view, rows_view, make_page_pool(kp.data(), pages, P, Hkv, D),
                                     make_page_pool(kp.data() + 8, pages, P, Hkv, D), std::span<const std::int64_t>(&slot, 1),
                                     make_page_scales(ks.data(), pages, Hkv), make_page_scales(v_held.data(), pages, Hkv)),
                      "v_cache");
  for (auto x : kp) ASSERT_EQ(x, 7);
  for (auto x : vp) ASSERT_EQ(x, 7);
  EXPECT_TRUE(held[1] == 0.0f && std::memcmp(held.data() + 2, &slot, sizeof slot) == 0 && v_held[1] == 0.0f);
  // fp8: fixed scales, broadcast allowed, must be > 0.
  std::vector<fp8_e4m3> fk(kp.size()), fv(kp.size());
  float zero = 0.0f, one = 1.0f;
  EXPECT_THROW_NAMING(write_kv_slots(make_thd<const float>(rows.data(), 1, Hkv, D), make_thd<const float>(rows.data(), 1, Hkv, D),
                                     make_page_pool(fk.data(), pages, P, Hkv, D), make_page_pool(fv.data(), pages, P, Hkv, D),
                                     std::span<const std::int64_t>(&slot, 1), PageScaleView{&zero, {1, 1}, {0, 0}},
                                     PageScaleView{&one, {1, 1}, {0, 0}}),
                      "k_scale");
}

/// A quantized KvCache: appended tokens read back within the quantization bound; attention
/// over the cache's pools and scales matches the reference over the dequantized cache;
/// fork's copy-on-write copies the page's scales and leaves the parent's bits alone.
template <class Q8>
void check_cache() {
  KvCacheConfig config{.num_layers = 2, .num_pages = 24, .page_size = 5, .heads_kv = 2, .head_dim = 32};
  if constexpr (!adaptive_scale<Q8>) config.k_scale = {0.5f, 0.25f}, config.v_scale = {0.125f};
  KvCache<Q8> cache(config);
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal;
  const auto tokens = [&](index_t n) {
    std::vector<bf16> x(static_cast<std::size_t>(2 * n * 2 * 32));
    for (auto& e : x) e = bf16(normal(rng));
    return x;
  };
  const SequenceId a = cache.create();
  auto ka = tokens(13), va = tokens(13);
  cache.append(a, make_bshd(ka.data(), 2, 13, 2, 32), make_bshd(va.data(), 2, 13, 2, 32));
  const SequenceId b = cache.fork(a);
  const auto parent_pages = std::vector<std::int32_t>(cache.pages(a).begin(), cache.pages(a).end());
  const auto k_before = std::vector<Q8>(cache.k_pages(1).data, cache.k_pages(1).data + 24 * 5 * 2 * 32);
  auto kb = tokens(4), vb = tokens(4);
  cache.append(b, make_bshd(kb.data(), 2, 4, 2, 32), make_bshd(vb.data(), 2, 4, 2, 32));
  // The parent's pages: bits and scales unchanged.
  for (std::int32_t page : parent_pages)
    for (index_t i = 0; i < 5 * 2 * 32; ++i)
      ASSERT_TRUE(k_before[static_cast<std::size_t>(page * 5 * 2 * 32 + i)] == cache.k_pages(1).data[page * 5 * 2 * 32 + i]);
  // Attention over both sequences in layer 1 against the reference over the dequantized cache.
  const std::vector<SequenceId> seqs{a, b};
  const auto tables = cache.batch(seqs);
  const index_t H = 4;
  std::vector<float> q(static_cast<std::size_t>(2 * H * 32)), o(q.size(), sentinel), lse(static_cast<std::size_t>(2 * H), sentinel);
  for (auto& x : q) x = normal(rng);
  PagedOptions opt;
  opt.k_scale = cache.k_scales(1);
  opt.v_scale = cache.v_scales(1);
  forward_paged(make_bshd<const float>(q.data(), 2, 1, H, 32), cache.k_pages(1), cache.v_pages(1), tables.block_table_view(),
                tables.seqlens(), make_bshd(o.data(), 2, 1, H, 32), make_lse(lse.data(), 2, H, 1), opt);
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    const index_t len = cache.length(seqs[s]);
    std::vector<float> kd(static_cast<std::size_t>(len * 2 * 32)), vd(kd.size());
    double worst_input_error = 0;
    for (index_t t = 0; t < len; ++t)
      for (index_t h = 0; h < 2; ++h) {
        const std::int32_t page = cache.pages(seqs[s])[static_cast<std::size_t>(t / 5)];
        const float sk = opt.k_scale(adaptive_scale<Q8> ? page : 0, h), sv = opt.v_scale(adaptive_scale<Q8> ? page : 0, h);
        for (index_t c = 0; c < 32; ++c) {
          const auto at = static_cast<std::size_t>((t * 2 + h) * 32 + c);
          kd[at] = to_float(cache.k_pages(1)(page, t % 5, h, c)) * sk;
          vd[at] = to_float(cache.v_pages(1)(page, t % 5, h, c)) * sv;
          const auto& src = s == 0 || t < 13 ? ka : kb;
          const index_t tt = s == 0 || t < 13 ? t : t - 13, n = s == 0 || t < 13 ? 13 : 4;
          const float x = to_float(src[static_cast<std::size_t>(((1 * n + tt) * 2 + h) * 32 + c)]);
          worst_input_error = std::max(worst_input_error, static_cast<double>(std::abs(kd[at] - x)) / std::max(1.0f, std::abs(x)));
        }
      }
    EXPECT_LT(worst_input_error, adaptive_scale<Q8> ? 0.05 : (std::is_same_v<Q8, fp8_e4m3> ? 0.07 : 0.13)) << kv_type_name<Q8>();
    const auto ref = reference::attention(make_bshd<const float>(q.data() + s * H * 32, 1, 1, H, 32),
                                          make_bshd<const float>(kd.data(), 1, len, 2, 32),
                                          make_bshd<const float>(vd.data(), 1, len, 2, 32), default_scale(32), false);
    const Deviation d = compare_to_reference(ref, make_bshd<const float>(o.data() + s * H * 32, 1, 1, H, 32),
                                             make_lse(lse.data() + s * H, 1, H, 1));
    EXPECT_TRUE(d.problem.empty()) << d.problem;
    EXPECT_LE(d.o, forward_o_tolerance) << kv_type_name<Q8>();
  }
  cache.free(a);
  cache.free(b);
  EXPECT_EQ(cache.free_pages(), 24);
}

TEST(QuantizedCache, Int8) { check_cache<std::int8_t>(); }
TEST(QuantizedCache, E4m3) { check_cache<fp8_e4m3>(); }
TEST(QuantizedCache, E5m2) { check_cache<fp8_e5m2>(); }

TEST(QuantizedCache, RejectsScalesItCannotUse) {
  KvCacheConfig config{.num_layers = 2, .num_pages = 4, .page_size = 4, .heads_kv = 2, .head_dim = 8};
  config.k_scale = {1.0f};
  EXPECT_THROW_NAMING(KvCache<std::int8_t>{config}, "k_scale");
  EXPECT_THROW_NAMING(KvCache<float>{config}, "k_scale");
  config.k_scale = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW_NAMING(KvCache<fp8_e4m3>{config}, "k_scale");
  config.k_scale = {};
  config.v_scale = {0.0f};
  EXPECT_THROW_NAMING(KvCache<fp8_e5m2>{config}, "v_scale");
  config.v_scale = {std::numeric_limits<float>::infinity()};
  EXPECT_THROW_NAMING(KvCache<fp8_e5m2>{config}, "v_scale");
  // Issue 27, N4: num_layers x heads_kv overflowed in the scale count's check; such a cache
  // is past the size bound, checked first.
  config = {.num_layers = index_t{1} << 62, .num_pages = 1, .page_size = 1, .heads_kv = 2, .head_dim = 1};
  config.k_scale = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW_NAMING(KvCache<fp8_e4m3>{config}, "num_layers");
}

}  // namespace
}  // namespace tileattn::test

namespace tileattn::test {
namespace {

/// Decode items take several K/V heads (ForwardWorkList's kv_heads_per_item) so that a
/// key's rows of all of them stream in as one run; each head's arithmetic must not change:
/// every grouping gives the bits of one head per item, for float, bf16 and 8-bit K/V.
template <class T, class KV>
void check_head_grouping() {
  const index_t B = 3, N = 1, Nk = 301, H = 8, Hkv = 4, D = 40;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  std::vector<T> q(static_cast<std::size_t>(B * N * H * D));
  std::vector<KV> k(static_cast<std::size_t>(B * Nk * Hkv * D)), v(k.size());
  for (auto& x : q) x = from_float<T>(normal(rng));
  const auto value = [&] {
    if constexpr (quantized_type<KV>) return quantize<KV>(normal(rng), 0.05f);
    else return from_float<KV>(normal(rng));
  };
  for (auto& x : k) x = value();
  for (auto& x : v) x = value();
  std::vector<float> scales(static_cast<std::size_t>(B * Hkv), 0.05f);
  ForwardOptions opt;
  if constexpr (quantized_type<KV>) {
    opt.k_scale = {scales.data(), {B, Hkv}, {Hkv, 1}};
    opt.v_scale = opt.k_scale;
  }
  const auto run = [&](index_t heads_per_item) {
    std::vector<T> o(q.size(), from_float<T>(sentinel));
    std::vector<float> lse(static_cast<std::size_t>(B * H * N), sentinel);
    auto p = detail::make_params(make_bshd<const T>(q.data(), B, N, H, D), make_bshd<const KV>(k.data(), B, Nk, Hkv, D),
                                 make_bshd<const KV>(v.data(), B, Nk, Hkv, D), make_bshd(o.data(), B, N, H, D),
                                 make_lse(lse.data(), B, H, N), opt);
    detail::set_kv_scales(p, opt, "batch", B);
    const TilePlan plan = forward_tiles(detail::plan_shape(p.q, p.k, p.v, B, N, Nk), opt);
    EXPECT_EQ(kernels::in_place_heads_per_item(p, plan), sizeof(KV) == 1 ? Hkv : 1);  // 8-bit: all grouped
    kernels::run_forward<NoIoCounting>(p, plan, kernels::ForwardWorkList(p, plan, {}, heads_per_item), opt.execution);
    std::vector<float> out = as_floats(o);
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
  const auto one = run(1);
  for (index_t g : {index_t{2}, index_t{4}}) EXPECT_TRUE(bitwise_equal(one, run(g))) << "heads per item " << g;
}

TEST(InPlaceHeadGrouping, ChangesNoBit) {
  check_head_grouping<float, float>();
  check_head_grouping<bf16, bf16>();
  check_head_grouping<bf16, std::int8_t>();
  check_head_grouping<float, fp8_e4m3>();
}

}  // namespace
}  // namespace tileattn::test
