// tests/paged/mla_test.cpp: forward_paged_mla (mla.hpp) over a paged latent pool: against the
// double reference over the dequantized latent (K the latent row, V its first head_dim_v
// columns), bitwise equal to forward_paged given V as a view of the latent pool (the generic
// path), the latent read once (IO counters), the same bits for every backend, thread count and
// split, bad arguments rejected with nothing written, and KvCache's latent pools.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/naive_same_precision.hpp"
#include "support/expect_throw_naming.hpp"
#include "support/test_support.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/mla.hpp"

namespace tileattn::test {
namespace {

struct LatentShape {
  std::vector<index_t> k_lens;
  index_t q_len = 1, heads_q = 16, heads_kv = 1, head_dim = 80, head_dim_v = 64, page_size = 16;
  index_t batch() const { return static_cast<index_t>(k_lens.size()); }
};

/// A random batch over a latent pool of S (float, bf16 or 8-bit with a scale per (page, latent
/// head)) with Q and O in T: pages shuffled, unused pool rows NaN (a stray read shows), the
/// dequantized latent of each sequence kept in float for the reference.
template <class T, class S>
struct LatentBatch {
  LatentShape shape;
  index_t max_pages = 0, num_pages = 0;
  std::vector<T> q, o;
  std::vector<S> pool;
  std::vector<float> scales;                // [num_pages, heads_kv] (8-bit S)
  std::vector<std::vector<float>> latent;   // per sequence [1, len, heads_kv, head_dim], dequantized
  std::vector<float> lse;
  std::vector<std::int32_t> table, seqlens;

  explicit LatentBatch(const LatentShape& s, std::uint64_t seed = 1) : shape(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
    const index_t P = s.page_size, row = s.heads_kv * s.head_dim;
    for (index_t len : s.k_lens) {
      max_pages = std::max(max_pages, (len + P - 1) / P);
      num_pages += (len + P - 1) / P;
    }
    max_pages += 1;
    num_pages += 2;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    pool.assign(static_cast<std::size_t>(num_pages * P * row), S(std::nanf("")));
    scales.resize(static_cast<std::size_t>(num_pages * s.heads_kv));
    for (float& x : scales) x = quantized_type<S> ? jitter(rng) / 8 : 1.0f;
    table.assign(static_cast<std::size_t>(s.batch() * max_pages), std::int32_t{1} << 30);
    std::size_t next = 0;
    for (index_t b = 0; b < s.batch(); ++b) {
      const index_t len = s.k_lens[static_cast<std::size_t>(b)];
      seqlens.push_back(static_cast<std::int32_t>(len));
      for (index_t j = 0; j * P < len; ++j) table[static_cast<std::size_t>(b * max_pages + j)] = order[next++];
      auto& lat = latent.emplace_back(static_cast<std::size_t>(len * row));
      for (index_t r = 0; r < len; ++r) {
        const index_t page = table[static_cast<std::size_t>(b * max_pages + r / P)];
        for (index_t h = 0; h < s.heads_kv; ++h)
          for (index_t c = 0; c < s.head_dim; ++c) {
            const float scale = scales[static_cast<std::size_t>(page * s.heads_kv + h)];
            const float x = normal(rng) * (quantized_type<S> ? 0.25f : 1.0f);
            const S stored = quantized_type<S> ? S(x / scale) : S(x);
            pool[static_cast<std::size_t>((page * P + r % P) * row + h * s.head_dim + c)] = stored;
            lat[static_cast<std::size_t>(r * row + h * s.head_dim + c)] =
                quantized_type<S> ? to_float(stored) * scale : to_float(stored);
          }
      }
    }
    q.resize(static_cast<std::size_t>(s.batch() * s.q_len * s.heads_q * s.head_dim));
    for (auto& x : q) x = from_float<T>(normal(rng));
    reset();
  }
  void reset() {
    o.assign(static_cast<std::size_t>(shape.batch() * shape.q_len * shape.heads_q * shape.head_dim_v),
             from_float<T>(sentinel));
    lse.assign(static_cast<std::size_t>(shape.batch() * shape.heads_q * shape.q_len), sentinel);
  }

  TensorView<const T> q_view() const {
    return make_bshd<const T>(q.data(), shape.batch(), shape.q_len, shape.heads_q, shape.head_dim);
  }
  TensorView<T> o_view() { return make_bshd(o.data(), shape.batch(), shape.q_len, shape.heads_q, shape.head_dim_v); }
  LseView lse_view() { return make_lse(lse.data(), shape.batch(), shape.heads_q, shape.q_len); }
  TensorView<const S> latent_pool() const {
    return make_bshd<const S>(pool.data(), num_pages, shape.page_size, shape.heads_kv, shape.head_dim);
  }
  /// The generic path's V: the latent pool's first head_dim_v columns, as a second pool.
  TensorView<const S> v_view_of_k() const {
    TensorView<const S> v = latent_pool();
    v.shape[3] = shape.head_dim_v;
    return v;
  }
  BlockTableView block_table() const { return make_block_table(table.data(), shape.batch(), max_pages); }
  PagedOptions with_scales(PagedOptions options) const {
    if constexpr (quantized_type<S>) options.k_scale = {scales.data(), {num_pages, shape.heads_kv}, {shape.heads_kv, 1}};
    return options;
  }

  void run_mla(const PagedOptions& options) {
    forward_paged_mla(q_view(), latent_pool(), block_table(), seqlens, o_view(), lse_view(), with_scales(options));
  }
  void run_generic(PagedOptions options) {
    options = with_scales(options);
    options.v_scale = options.k_scale;
    forward_paged(q_view(), latent_pool(), v_view_of_k(), block_table(), seqlens, o_view(), lse_view(), options);
  }

  /// Sequence b's Q (as floats), its dequantized latent as K and V's view, O and LSE as floats.
  std::vector<float> q_float(index_t b) const {
    const index_t n = shape.q_len * shape.heads_q * shape.head_dim;
    std::vector<float> out(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = to_float(q[static_cast<std::size_t>(b * n + i)]);
    return out;
  }
  TensorView<const float> k_of(index_t b) const {
    return make_bshd<const float>(latent[static_cast<std::size_t>(b)].data(), 1, shape.k_lens[static_cast<std::size_t>(b)],
                                  shape.heads_kv, shape.head_dim);
  }
  TensorView<const float> v_of(index_t b) const {
    TensorView<const float> v = k_of(b);
    v.shape[3] = shape.head_dim_v;
    return v;
  }
  std::vector<float> o_float(index_t b) const {
    const index_t n = shape.q_len * shape.heads_q * shape.head_dim_v;
    std::vector<float> out(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = to_float(o[static_cast<std::size_t>(b * n + i)]);
    return out;
  }

  /// The largest deviation of O and LSE from the double reference, and (bf16 Q) of a naive
  /// implementation in bf16 from it: the bound is twice that.
  struct Errors {
    Deviation kernel;
    double naive_o = 0.0;
  };
  Errors against_reference(const ForwardOptions& options) const {
    Errors e;
    for (index_t b = 0; b < shape.batch(); ++b) {
      reference::Options ref_opt = reference::Options::from(options);
      ref_opt.batch_index = b;
      const std::vector<float> qf = q_float(b);
      const auto qv = make_bshd<const float>(qf.data(), 1, shape.q_len, shape.heads_q, shape.head_dim);
      const auto ref = reference::attention(qv, k_of(b), v_of(b), ref_opt);
      std::vector<float> ob = o_float(b);
      const index_t nl = shape.heads_q * shape.q_len;
      std::vector<float> lb(lse.begin() + b * nl, lse.begin() + (b + 1) * nl);
      const Deviation d = compare_to_reference(
          ref, make_bshd<const float>(ob.data(), 1, shape.q_len, shape.heads_q, shape.head_dim_v),
          make_lse(lb.data(), 1, shape.heads_q, shape.q_len));
      e.kernel.o = std::max(e.kernel.o, d.o);
      e.kernel.lse = std::max(e.kernel.lse, d.lse);
      if (e.kernel.problem.empty() && !d.problem.empty()) e.kernel.problem = d.problem;
      if constexpr (std::is_same_v<T, bf16>) {
        std::vector<float> on(ob.size()), ln(lb.size());
        naive_same_precision<bf16>(qv, k_of(b), v_of(b), ref_opt,
                                   make_bshd(on.data(), 1, shape.q_len, shape.heads_q, shape.head_dim_v),
                                   make_lse(ln.data(), 1, shape.heads_q, shape.q_len));
        const Deviation n = compare_to_reference(
            ref, make_bshd<const float>(on.data(), 1, shape.q_len, shape.heads_q, shape.head_dim_v), LseView{});
        e.naive_o = std::max(e.naive_o, n.o);
      }
    }
    return e;
  }
};

template <class T, class S>
void expect_matches_reference(const LatentShape& shape, const PagedOptions& options, const char* what) {
  SCOPED_TRACE(what);
  LatentBatch<T, S> batch(shape);
  batch.run_mla(options);
  const auto e = batch.against_reference(options);
  EXPECT_TRUE(e.kernel.problem.empty()) << e.kernel.problem;
  if constexpr (std::is_same_v<T, bf16>) {
    EXPECT_LE(e.kernel.o, 2 * e.naive_o + 1e-6) << "naive bf16: " << e.naive_o;
    EXPECT_LE(e.kernel.lse, 2e-2);  // bf16 Q and K: scores to ~3 significant digits
  } else {
    EXPECT_LE(e.kernel.o, 4 * forward_o_tolerance);
    EXPECT_LE(e.kernel.lse, 4 * forward_lse_tolerance);
  }
}

PagedOptions threads(int n) {
  PagedOptions o;
  o.execution.num_threads = n;
  return o;
}

// ---- Against the reference ----------------------------------------------------------------

TEST(Mla, DecodeMatchesReference) {
  const LatentShape small{{1, 17, 127, 1000}, 1, 16, 1, 80, 64};     // rank 64 + 16 rotary, 16 heads
  const LatentShape folded{{17, 300}, 1, 128, 1, 80, 64};           // 128 heads in one group
  const LatentShape deepseek{{127}, 1, 16, 1, 576, 512};            // kv_lora_rank 512 + 64
  expect_matches_reference<float, float>(small, threads(2), "float, Hq 16");
  expect_matches_reference<float, float>(folded, threads(2), "float, Hq 128");
  expect_matches_reference<bf16, bf16>(small, threads(2), "bf16, Hq 16");
  expect_matches_reference<bf16, bf16>(folded, threads(2), "bf16, Hq 128");
  expect_matches_reference<bf16, bf16>(deepseek, threads(2), "bf16, 576/512");
  expect_matches_reference<float, fp8_e4m3>(small, threads(2), "fp8 e4m3 latent, Hq 16");
  expect_matches_reference<float, fp8_e4m3>(folded, threads(2), "fp8 e4m3 latent, Hq 128");
}

TEST(Mla, ChunkedPrefillAndOptionsMatchReference) {
  PagedOptions causal = threads(2);
  causal.causal = true;
  const LatentShape prefill{{5, 130, 1000}, 5, 16, 1, 80, 64};       // 5 new tokens at the end
  expect_matches_reference<float, float>(prefill, causal, "causal prefill, float");
  expect_matches_reference<bf16, bf16>(prefill, causal, "causal prefill, bf16");
  PagedOptions mods = causal;
  mods.softcap = 30.0f;
  mods.window_left = 100;
  const std::vector<float> sinks(16, 0.5f);
  mods.sinks = sinks;
  expect_matches_reference<float, float>(prefill, mods, "softcap, window, sinks");
  PagedOptions split = threads(2);
  split.num_splits = 4;
  expect_matches_reference<float, float>({{1000, 33}, 1, 128, 1, 80, 64}, split, "split-KV");
  expect_matches_reference<float, float>({{300}, 2, 16, 2, 48, 48}, threads(1), "two latent heads, dv = d");
}

TEST(Mla, VarlenMatchesFixedLength) {
  LatentBatch<float, float> batch({{17, 200}, 3, 16, 1, 80, 64});
  PagedOptions causal = threads(2);
  causal.causal = true;
  batch.run_mla(causal);
  const std::vector<float> fixed = batch.o;
  batch.reset();
  const std::vector<std::int32_t> cu{0, 3, 6};
  forward_paged_mla_varlen(make_thd<const float>(batch.q.data(), 6, 16, 80), batch.latent_pool(), batch.block_table(),
                           batch.seqlens, make_thd(batch.o.data(), 6, 16, 64), PackedLseView{}, cu, causal);
  EXPECT_EQ(0, std::memcmp(fixed.data(), batch.o.data(), fixed.size() * sizeof(float)));
}

// ---- The generic path, the IO, the bits ---------------------------------------------------

template <class T, class S>
void expect_generic_bits(const LatentShape& shape, const PagedOptions& options, const char* what) {
  SCOPED_TRACE(what);
  LatentBatch<T, S> batch(shape);
  batch.run_generic(options);
  const std::vector<T> o = batch.o;
  const std::vector<float> lse = batch.lse;
  batch.reset();
  batch.run_mla(options);
  EXPECT_EQ(0, std::memcmp(o.data(), batch.o.data(), o.size() * sizeof(T)));
  EXPECT_EQ(0, std::memcmp(lse.data(), batch.lse.data(), lse.size() * sizeof(float)));
}

TEST(Mla, SameBitsAsGenericPathWithVAsViewOfK) {
  PagedOptions split = threads(2);
  split.num_splits = 3;
  PagedOptions causal = threads(2);
  causal.causal = true;
  for (const PagedOptions& o : {threads(2), split}) {
    expect_generic_bits<bf16, bf16>({{17, 1000}, 1, 16, 1, 80, 64}, o, "bf16, Hq 16 (in place)");
    expect_generic_bits<bf16, bf16>({{17, 1000}, 1, 128, 1, 80, 64}, o, "bf16, Hq 128 (packed)");
    expect_generic_bits<float, float>({{127}, 1, 128, 1, 80, 64}, o, "float, Hq 128");
    expect_generic_bits<float, fp8_e4m3>({{127}, 1, 128, 1, 80, 64}, o, "fp8, Hq 128");
  }
  expect_generic_bits<bf16, bf16>({{300}, 4, 16, 1, 576, 512}, causal, "bf16 576/512, verify of 4");
  expect_generic_bits<bf16, bf16>({{64, 65}, 1, 32, 1, 79, 33}, threads(1), "odd head dims");
}

TEST(Mla, SharedPrefixSameBitsAsGenericPath) {
  LatentBatch<bf16, bf16> batch({{600, 600, 700}, 1, 32, 1, 80, 64});
  for (index_t b = 1; b < 3; ++b)  // the first 512 keys of sequence 0 (KvCache::fork would share them)
    std::copy_n(batch.table.begin(), 32, batch.table.begin() + b * batch.max_pages);
  const PagedPlan plan = plan_forward_paged_mla(batch.q_view(), batch.latent_pool(), batch.block_table(),
                                                batch.seqlens, batch.o_view(), batch.lse_view(), threads(2));
  ASSERT_NE(plan.shared_prefix(), nullptr);  // the prefix-once pass runs
  batch.run_generic(threads(2));
  const std::vector<bf16> want = batch.o;
  batch.reset();
  batch.run_mla(threads(2));
  EXPECT_EQ(0, std::memcmp(want.data(), batch.o.data(), want.size() * sizeof(bf16)));
}

/// Bytes one call reads, single-threaded, unsplit, a budget large enough for every head's
/// rows in one item.
template <class T, class S>
std::uint64_t bytes_read(LatentBatch<T, S>& batch, bool mla) {
  PagedOptions o = threads(1);
  o.num_splits = 1;
  o.sram_budget_bytes = 8u << 20;
  IoCounts io;
  o.io_counts = &io;
  if (mla) batch.run_mla(o);
  else batch.run_generic(o);
  return io.bytes_read;
}

TEST(Mla, ReadsEachLatentRowOncePerGroup) {
  for (const index_t heads : {16, 128}) {  // in place (16 rows) and packed
    SCOPED_TRACE(heads);
    LatentBatch<bf16, bf16> batch({{1000}, 1, heads, 1, 576, 512});
    const std::uint64_t latent = 1000u * 576 * sizeof(bf16), values = 1000u * 512 * sizeof(bf16);
    const std::uint64_t queries = static_cast<std::uint64_t>(heads) * 576 * sizeof(bf16);
    EXPECT_EQ(bytes_read(batch, true), latent + queries);           // the latent once, Q once
    EXPECT_EQ(bytes_read(batch, false), latent + values + queries);  // the generic path: K, then V
  }
  LatentBatch<float, fp8_e4m3> fp8({{1000}, 1, 128, 1, 80, 64});
  const std::uint64_t scales = 63 * sizeof(float);  // one per page for K: V's are the same
  EXPECT_EQ(bytes_read(fp8, true), 1000u * 80 + 128u * 80 * sizeof(float) + scales);
}

TEST(Mla, SameBitsForEveryBackendThreadCountAndTiling) {
  LatentBatch<bf16, bf16> batch({{1, 17, 1000, 3000}, 1, 128, 1, 80, 64});
  batch.run_mla(threads(1));
  const std::vector<bf16> want = batch.o;
  for (const Backend backend : compiled_backends())
    for (const int n : {1, 2, 3}) {
      PagedOptions o = threads(n);
      o.execution.backend = backend;
      batch.reset();
      batch.run_mla(o);
      EXPECT_EQ(0, std::memcmp(want.data(), batch.o.data(), want.size() * sizeof(bf16)))
          << "backend " << static_cast<int>(backend) << ", " << n << " threads";
    }
  // A small budget: the 128 heads in several items (the same key tiles: the budget never
  // changes them, so the same bits as the generic path's, and as under a large budget).
  PagedOptions small = threads(2);
  small.sram_budget_bytes = rows_budget_for<bf16>(32, 80, 64);
  expect_generic_bits<bf16, bf16>({{1, 17, 1000, 3000}, 1, 128, 1, 80, 64}, small, "32-row budget");
  expect_matches_reference<bf16, bf16>({{1, 17, 1000, 3000}, 1, 128, 1, 80, 64}, small, "32-row budget");
}

TEST(Mla, PlanIsReusable) {
  LatentBatch<bf16, bf16> batch({{17, 1000}, 1, 16, 1, 80, 64});
  batch.run_mla(threads(2));
  const std::vector<bf16> want = batch.o;
  const PagedPlan plan = plan_forward_paged_mla(batch.q_view(), batch.latent_pool(), batch.block_table(),
                                                batch.seqlens, batch.o_view(), batch.lse_view(), threads(2));
  batch.reset();
  forward_paged_mla(plan, batch.q_view(), batch.latent_pool(), batch.block_table(), batch.seqlens, batch.o_view(),
                    batch.lse_view(), threads(2));
  EXPECT_EQ(0, std::memcmp(want.data(), batch.o.data(), want.size() * sizeof(bf16)));
}

// ---- Bad arguments ------------------------------------------------------------------------

TEST(Mla, RejectsWhatItCannotTakeAndWritesNothing) {
  LatentBatch<float, float> batch({{40}, 1, 16, 1, 80, 64});
  const std::vector<float> untouched = batch.o;
  std::vector<float> wide(static_cast<std::size_t>(16 * 96));
  EXPECT_THROW_NAMING(forward_paged_mla(batch.q_view(), batch.latent_pool(), batch.block_table(), batch.seqlens,
                                        make_bshd(wide.data(), 1, 1, 16, 96), PagedOptions{}),
                      "o");
  std::vector<float> table(32 * 8, 1.0f);
  PagedOptions rotary;
  rotary.rotary.cos = {table.data(), {32, 8}, {8, 1}};
  rotary.rotary.sin = rotary.rotary.cos;
  EXPECT_THROW_NAMING(batch.run_mla(rotary), "rotary");
  LatentBatch<float, fp8_e4m3> fp8({{40}, 1, 16, 1, 80, 64});
  PagedOptions v_scale;
  const float one = 1.0f;
  v_scale.v_scale = per_tensor_scale(&one);
  EXPECT_THROW_NAMING(fp8.run_mla(v_scale), "v_scale");
  std::vector<float> q3(static_cast<std::size_t>(3 * 80));  // 3 query heads over 2 latent heads
  LatentBatch<float, float> two({{40}, 1, 4, 2, 80, 64});
  EXPECT_ANY_THROW(forward_paged_mla(make_bshd<const float>(q3.data(), 1, 1, 3, 80), two.latent_pool(),
                                     two.block_table(), two.seqlens, make_bshd(wide.data(), 1, 1, 3, 64)));
  EXPECT_EQ(0, std::memcmp(untouched.data(), batch.o.data(), untouched.size() * sizeof(float)));
}

// ---- KvCache's latent pools ----------------------------------------------------------------

TEST(MlaCache, AppendsAndWritesLatentRowsAttendedByMla) {
  constexpr index_t layers = 2, d = 80, dv = 64, heads = 16;
  KvCache<float> cache({.num_layers = layers, .num_pages = 40, .page_size = 16, .heads_kv = 1, .head_dim = d,
                        .head_dim_v = dv, .latent = true});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const auto random = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  const std::vector<float> rows = random(layers * 100 * d);
  const SequenceId a = cache.create(), b = cache.create();
  cache.append_latent(a, make_bshd<const float>(rows.data(), layers, 100, 1, d));
  cache.extend(b, 37);
  const std::vector<float> rows_b = random(37 * d);
  for (index_t l = 0; l < layers; ++l)
    cache.write_latent(l, b, StridedView<const float, 3>{rows_b.data(), {37, 1, d}, {d, d, 1}});
  const auto pool = cache.k_pages(1);
  const auto values = cache.v_pages(1);
  EXPECT_EQ(pool.data, values.data);
  EXPECT_EQ(values.shape[3], dv);
  EXPECT_EQ(values.stride, pool.stride);
  const auto page_a = cache.pages(a);
  EXPECT_EQ(pool(page_a[6], 3, 0, 5), rows[static_cast<std::size_t>((100 + 6 * 16 + 3) * d + 5)]);  // layer 1, token 99

  // A fork's partly filled last page is copied on write (the latent pool alone: no V pool).
  const SequenceId c = cache.fork(a);
  cache.extend(c, 1);
  const std::vector<float> row_c = random(d);
  cache.write_latent(1, c, StridedView<const float, 3>{row_c.data(), {1, 1, d}, {d, d, 1}});
  const std::int32_t copied = cache.pages(c)[6];
  EXPECT_NE(copied, page_a[6]);
  EXPECT_EQ(pool(copied, 3, 0, 5), pool(page_a[6], 3, 0, 5));  // token 99, copied
  EXPECT_EQ(pool(copied, 4, 0, 7), row_c[7]);                    // token 100, the fork's own
  cache.free(c);

  const std::vector<float> q = random(2 * heads * d);
  std::vector<float> o(2 * heads * dv), o_generic(o.size());
  const std::vector<SequenceId> ids{a, b};
  const auto tables = cache.batch(ids);
  forward_paged_mla(make_bshd<const float>(q.data(), 2, 1, heads, d), pool, tables.block_table_view(),
                    tables.seqlens(), make_bshd(o.data(), 2, 1, heads, dv));
  forward_paged(make_bshd<const float>(q.data(), 2, 1, heads, d), pool, values, tables.block_table_view(),
                tables.seqlens(), make_bshd(o_generic.data(), 2, 1, heads, dv));
  EXPECT_EQ(0, std::memcmp(o.data(), o_generic.data(), o.size() * sizeof(float)));
  const auto latent_b = make_bshd<const float>(rows_b.data(), 1, 37, 1, d);
  auto values_b = latent_b;
  values_b.shape[3] = dv;
  const auto ref = reference::attention(make_bshd<const float>(q.data() + heads * d, 1, 1, heads, d), latent_b,
                                        values_b, reference::Options{});
  const Deviation dev = compare_to_reference(ref, make_bshd<const float>(o.data() + heads * dv, 1, 1, heads, dv), LseView{});
  EXPECT_TRUE(dev.problem.empty()) << dev.problem;
  EXPECT_LE(dev.o, forward_o_tolerance);
}

/// An int8 latent cache quantizes as write_kv_slots quantizes K (scales growing per page):
/// the same bytes and scales as a K/V cache given the rows as K.
TEST(MlaCache, Int8LatentQuantizesAsKvCacheK) {
  constexpr index_t d = 48, dv = 32, n = 40;
  KvCacheConfig config{.num_layers = 1, .num_pages = 8, .page_size = 16, .heads_kv = 1, .head_dim = d, .head_dim_v = dv};
  KvCache<std::int8_t> kv(config);
  config.latent = true;
  KvCache<std::int8_t> latent(config);
  std::vector<float> rows(n * d);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = normal(rng) * (1.0f + static_cast<float>(i % 97) / 10.0f);
  const auto as_k = make_bshd<const float>(rows.data(), 1, n, 1, d);
  auto as_v = as_k;
  as_v.shape[3] = dv;
  const SequenceId s = kv.create(), t = latent.create();
  kv.append(s, as_k, as_v);
  latent.append_latent(t, as_k);
  EXPECT_EQ(latent.v_scales(0).data, latent.k_scales(0).data);
  for (index_t token = 0; token < n; ++token) {
    const std::int32_t page = latent.pages(t)[static_cast<std::size_t>(token / 16)];
    EXPECT_EQ(page, kv.pages(s)[static_cast<std::size_t>(token / 16)]);
    EXPECT_EQ(latent.k_scales(0)(page, 0), kv.k_scales(0)(page, 0));
    for (index_t c = 0; c < d; ++c) EXPECT_EQ(latent.k_pages(0)(page, token % 16, 0, c), kv.k_pages(0)(page, token % 16, 0, c));
  }
}

TEST(MlaCache, RejectsKvWritesAndBadConfigs) {
  KvCache<float> latent({.num_pages = 4, .heads_kv = 1, .head_dim = 8, .head_dim_v = 4, .latent = true});
  KvCache<float> plain({.num_pages = 4, .heads_kv = 1, .head_dim = 8});
  const SequenceId s = latent.create(), t = plain.create();
  latent.extend(s, 2);
  plain.extend(t, 2);
  std::vector<float> k(16), v(8);
  const StridedView<const float, 3> k_rows{k.data(), {2, 1, 8}, {8, 8, 1}}, v_rows{v.data(), {2, 1, 4}, {4, 4, 1}};
  EXPECT_THROW_NAMING(latent.write(0, s, k_rows, v_rows), "v_new");
  EXPECT_THROW_NAMING(plain.write_latent(0, t, k_rows), "latent_new");
  EXPECT_THROW_NAMING(latent.write_latent(0, s, v_rows), "latent_new.shape[2] (head_dim)");
  EXPECT_THROW_NAMING((KvCache<float>({.num_pages = 4, .heads_kv = 1, .head_dim = 8, .head_dim_v = 9, .latent = true})),
                      "head_dim_v");
  EXPECT_THROW_NAMING((KvCache<fp8_e4m3>({.num_pages = 4, .heads_kv = 1, .head_dim = 8, .v_scale = {2.0f}, .latent = true})),
                      "v_scale");
}

}  // namespace
}  // namespace tileattn::test
