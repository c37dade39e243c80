// benchmarks/bench_paged.cpp: paged decoding against the machine's read bandwidth, paged
// chunked prefill and speculative verify against the contiguous forward, and the cost of a
// decode plan, in one run.
//
// Decoding is memory-bound: each step reads every cached K/V byte once (GQA: once per group
// of query heads) and does ~4 FLOPs per byte-pair of fp32. So a decode row reports the K/V
// bytes it reads per second (counted in the stored type: 2 per bf16 value, 1 per fp8 or int8,
// 18 per q4_0 block of 32 values, 17 per MXFP4 block) and their fraction
// of a streaming read of 1 GiB measured by this binary on the same threads (ceilings.hpp).
// Verify and chunked-prefill rows credit 4 * d FLOPs per visited (query, key) pair (causal,
// bottom-right aligned) to the paged and to the contiguous forward alike; their ratio is the
// cost of reading K/V through a block table.
//
// Workloads: 32 query heads, 8 K/V heads, head_dim 128, page_size 16, block tables shuffled
// (pages in random pool order), N(0, 1)-like data. Decode: B 8 at contexts 1k, 4k, 16k and
// B 1 at 16k and 64k, fp32 and bf16. Verify: B 8, context 4k, 4 and 8 new tokens; chunked
// prefill: B 1, context 4k, a 256-token chunk. plan: plan_forward_paged for B 8 at 4k (what a
// decode step does once for all its layers) next to one decode step of one layer.
// rotary_step: a decode step (write the new token's K/V, attend) with rotary embedding fused
// into KvCache::write and forward_paged's Q load, against rotating K and Q in a separate pass
// (apply_rotary) first; B 8 at contexts 64, 512 and 4k, fp32 and bf16; rotary_step/paired
// alternates the two on one workload and reports the median per-iteration speedup.
//
// topk/bf16: top-k sparse decode (forward_paged_topk) of 2048 keys chosen at random per
// sequence, B 1 at 32k and B 8 at 16k; KV_GB/s counts the gathered K/V bytes (compare with the
// decode rows' rate; benchmarks/side_by_side/topk_timer.cpp pairs it with dense decode).
//
// Prefix-once (shared_prefix/...): B 8 sequences share a 16k-token prefix (the same pages in
// every block table, as KvCache::fork leaves them) and have 100-499 tokens of their own;
// one decode step with PagedOptions::shared_prefix on ("once") and off ("per_sequence").
// KV_GB/s counts the K/V bytes each path reads (the prefix once, or once per sequence),
// of_stream their fraction of the streaming read; step_GB/s is the per-sequence bytes over
// the time for both, so its ratio between the two rows is the speedup.
//
// MLA (mla_decode/bf16/...): an absorbed DeepSeek decode step, 128 query heads over one bf16
// latent head of 576 (V its first 512), B 1 at 4k and B 4 at 8k: forward_paged_mla ("mla")
// against forward_paged with V a view of the latent ("generic"); GFLOP/s counts
// 128 x keys x 1088 x 2.
//
//   bench_paged --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   bench_paged --benchmark_filter=decode/fp32      # one group
// Threads: the default Execution (all hardware threads, or OMP_NUM_THREADS).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "tileattn/tileattn.hpp"

namespace {

using tileattn::index_t;
constexpr index_t heads_q = 32, heads_kv = 8, head_dim = 128, page_size = 16;

/// A paged batch: B sequences of `context` keys in shuffled pages, q_len new tokens each;
/// Q and O in T, K and V in KV (8-bit ones with per-(page, K/V head) scales).
template <class T, class KV = T>
struct PagedWorkload {
  index_t batch, context, q_len;
  index_t max_pages, num_pages;
  std::vector<KV, tileattn::LineAlignedAllocator<KV>> k_pool, v_pool;
  std::vector<T> q, o;
  std::vector<KV> k_flat, v_flat;  // the same keys contiguous (verify rows)
  std::vector<float> lse, k_scales, v_scales;
  std::vector<std::int32_t> table, seqlens;

  PagedWorkload(index_t b, index_t ctx, index_t nq, bool contiguous_copy)
      : batch(b), context(ctx), q_len(nq), max_pages((ctx + page_size - 1) / page_size), num_pages(b * max_pages) {
    const auto row = static_cast<std::size_t>(heads_kv * head_dim / tileattn::values_per_element<KV>);  // elements
    k_pool.resize(static_cast<std::size_t>(num_pages * page_size) * row);
    v_pool.resize(k_pool.size());
    std::uint32_t state = 12345u;
    const auto value = [&] {  // cheap values in [-2, 2): the timing does not depend on them
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / 4194304.0f - 2.0f;
    };
    const auto next = [&] { return tileattn::from_float<T>(value()); };
    if constexpr (tileattn::quantized_type<KV>) {
      const float scale = std::is_same_v<KV, std::int8_t> ? 2.0f / tileattn::int8_max : 1.0f / 64.0f;
      k_scales.assign(static_cast<std::size_t>(num_pages * heads_kv), scale);
      v_scales = k_scales;
      for (auto& x : k_pool) x = tileattn::quantize<KV>(value(), scale);
      for (auto& x : v_pool) x = tileattn::quantize<KV>(value(), scale);
    } else if constexpr (tileattn::block_quantized_type<KV>) {  // 4-bit blocks, quantized here
      float values[KV::values];
      for (auto* pool : {&k_pool, &v_pool})
        for (auto& x : *pool) {
          for (float& e : values) e = value();
          x = tileattn::quantize_block<KV>(values);
        }
    } else {
      for (auto& x : k_pool) x = next();
      for (auto& x : v_pool) x = next();
    }
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    table = order;
    seqlens.assign(static_cast<std::size_t>(b), static_cast<std::int32_t>(ctx));
    q.resize(static_cast<std::size_t>(b * nq * heads_q * head_dim));
    for (auto& x : q) x = next();
    o.resize(q.size());
    lse.resize(static_cast<std::size_t>(b * heads_q * nq));
    if (contiguous_copy) {  // [B, ctx, heads_kv, d] gathered from the pages
      k_flat.resize(static_cast<std::size_t>(b * ctx) * row);
      v_flat.resize(k_flat.size());
      for (index_t s = 0; s < b; ++s)
        for (index_t t = 0; t < ctx; ++t) {
          const auto page = static_cast<std::size_t>(table[static_cast<std::size_t>(s * max_pages + t / page_size)]);
          const std::size_t from = (page * page_size + static_cast<std::size_t>(t % page_size)) * row;
          const std::size_t to = static_cast<std::size_t>(s * ctx + t) * row;
          std::copy_n(k_pool.begin() + static_cast<std::ptrdiff_t>(from), row, k_flat.begin() + static_cast<std::ptrdiff_t>(to));
          std::copy_n(v_pool.begin() + static_cast<std::ptrdiff_t>(from), row, v_flat.begin() + static_cast<std::ptrdiff_t>(to));
        }
    }
  }

  tileattn::TensorView<const T> q_view() const { return tileattn::make_bshd<const T>(q.data(), batch, q_len, heads_q, head_dim); }
  tileattn::TensorView<T> o_view() { return tileattn::make_bshd(o.data(), batch, q_len, heads_q, head_dim); }
  tileattn::LseView lse_view() { return tileattn::make_lse(lse.data(), batch, heads_q, q_len); }
  tileattn::TensorView<const KV> pool(const auto& p) const {
    return tileattn::make_bshd<const KV>(p.data(), num_pages, page_size, heads_kv, head_dim / tileattn::values_per_element<KV>);
  }
  tileattn::BlockTableView block_table() const { return tileattn::make_block_table(table.data(), batch, max_pages); }

  tileattn::PagedOptions options() const {
    tileattn::PagedOptions opts;
    opts.causal = q_len > 1;
    if constexpr (tileattn::quantized_type<KV>) {
      opts.k_scale = {k_scales.data(), {num_pages, heads_kv}, {heads_kv, 1}};
      opts.v_scale = {v_scales.data(), {num_pages, heads_kv}, {heads_kv, 1}};
    }
    return opts;
  }
  void paged() {
    tileattn::forward_paged(q_view(), pool(k_pool), pool(v_pool), block_table(), seqlens, o_view(), lse_view(),
                            options());
  }
  void paged(const tileattn::PagedPlan& plan) {
    tileattn::forward_paged(plan, q_view(), pool(k_pool), pool(v_pool), block_table(), seqlens, o_view(),
                            lse_view(), options());
  }
  tileattn::PagedPlan plan() const {
    auto* self = const_cast<PagedWorkload*>(this);
    return tileattn::plan_forward_paged(q_view(), pool(k_pool), pool(v_pool), block_table(), seqlens, self->o_view(),
                                self->lse_view(), options());
  }
  void contiguous() {
    const auto kv = [&](const std::vector<KV>& x) {
      return tileattn::make_bshd<const KV>(x.data(), batch, context, heads_kv, head_dim);
    };
    tileattn::forward(q_view(), kv(k_flat), kv(v_flat), o_view(), lse_view(), options());
  }

  double kv_bytes() const {
    return 2.0 * static_cast<double>(batch * context * heads_kv * head_dim / tileattn::values_per_element<KV>) * sizeof(KV);
  }
  /// 4 d FLOPs per visited (query, key) pair: causal bottom-right, q_len new tokens.
  double flops() const {
    const double n = static_cast<double>(q_len), keys = static_cast<double>(context);
    const double pairs = n * (keys - n) + n * (n + 1) / 2;
    return 4.0 * static_cast<double>(head_dim) * pairs * static_cast<double>(batch * heads_q);
  }
};

/// One workload per (type, shape), built outside every timed loop; the previous one is
/// freed first (the 16k and 64k contexts take up to 1 GiB).
template <class T, class KV = T>
PagedWorkload<T, KV>& workload(index_t b, index_t ctx, index_t nq, bool contiguous_copy) {
  static std::unique_ptr<PagedWorkload<T, KV>> cached;
  if (!cached || cached->batch != b || cached->context != ctx || cached->q_len != nq ||
      cached->k_flat.empty() == contiguous_copy) {
    cached.reset();
    cached = std::make_unique<PagedWorkload<T, KV>>(b, ctx, nq, contiguous_copy);
  }
  return *cached;
}

int threads() { return tileattn::worker_count(tileattn::Execution{}); }

template <class Body>
void timed(benchmark::State& state, Body body) {
  for (auto _ : state) {
    const auto start = tileattn::bench::Clock::now();
    body();
    state.SetIterationTime(std::chrono::duration<double>(tileattn::bench::Clock::now() - start).count());
  }
}

template <class T, class KV = T>
void decode(benchmark::State& state) {
  auto& w = workload<T, KV>(state.range(0), state.range(1), 1, false);
  w.paged();  // warm: first-touch of the outputs and scratch
  timed(state, [&] { w.paged(); });
  const double stream = tileattn::bench::stream_read_gbps(threads());
  state.counters["KV_GB/s"] = benchmark::Counter(w.kv_bytes() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["stream_GB/s"] = stream;
  state.counters["of_stream"] = benchmark::Counter(w.kv_bytes() * 1e-9 / stream, benchmark::Counter::kIsIterationInvariantRate);
}

/// Top-k sparse decode: state.range(2) keys per sequence, chosen at random (random order).
template <class T>
void decode_topk(benchmark::State& state) {
  auto& w = workload<T>(state.range(0), state.range(1), 1, false);
  const index_t topk = state.range(2);
  std::vector<std::int32_t> idx;
  std::mt19937 rng(5);
  for (index_t b = 0; b < w.batch; ++b) {
    std::vector<std::int32_t> keys(static_cast<std::size_t>(w.context));
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    idx.insert(idx.end(), keys.begin(), keys.begin() + topk);
  }
  const auto run = [&] {
    tileattn::forward_paged_topk(w.q_view(), w.pool(w.k_pool), w.pool(w.v_pool), w.block_table(), w.seqlens,
                                 tileattn::make_topk_indices(idx.data(), w.batch, 1, topk), w.o_view(), w.lse_view(),
                                 w.options());
  };
  run();  // warm
  timed(state, run);
  const double bytes = 2.0 * static_cast<double>(w.batch * topk * heads_kv * head_dim) * sizeof(T);
  state.counters["KV_GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void verify(benchmark::State& state, bool paged) {
  auto& w = workload<T>(state.range(0), state.range(1), state.range(2), true);
  if (paged) {
    w.paged();
    timed(state, [&] { w.paged(); });
  } else {
    w.contiguous();
    timed(state, [&] { w.contiguous(); });
  }
  state.counters["GFLOP/s"] = benchmark::Counter(w.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void plan_cost(benchmark::State& state) {
  auto& w = workload<float>(8, 4096, 1, false);
  timed(state, [&] { benchmark::DoNotOptimize(w.plan()); });
}

void decode_with_plan(benchmark::State& state) {
  auto& w = workload<float>(8, 4096, 1, false);
  const tileattn::PagedPlan plan = w.plan();
  w.paged(plan);
  timed(state, [&] { w.paged(plan); });
}

/// A decode step with rotary embedding, fused or not: B sequences of `context` tokens in a
/// one-layer KvCache<T>, the new token's K and V written at the last position (the same slot
/// every step, so the cache does not grow), then attention of its Q over the cache. Fused:
/// KvCache::write rotates K as it writes it and forward_paged rotates Q as it loads it
/// (options.rotary). Unfused: apply_rotary rotates K and Q in place first (a separate pass
/// over them, as a model without the fused calls does), then the plain write and
/// forward_paged. Llama-style tables (base 10000, rotary_dim = head_dim).
template <class T>
struct RotaryStep {
  index_t batch, context;
  tileattn::KvCache<T> cache;
  std::vector<tileattn::SequenceId> ids;
  std::vector<float> cos, sin;
  std::vector<T> q, k_new, v_new, o;
  std::vector<std::int64_t> positions;
  typename tileattn::KvCache<T>::BatchTables tables;

  RotaryStep(index_t b, index_t ctx)
      : batch(b), context(ctx),
        cache({.num_layers = 1, .num_pages = b * ((ctx + page_size - 1) / page_size), .page_size = page_size,
               .heads_kv = heads_kv, .head_dim = head_dim}) {
    std::uint32_t state = 777u;
    const auto value = [&] {
      state = state * 1664525u + 1013904223u;
      return tileattn::from_float<T>(static_cast<float>(state >> 8) / 4194304.0f - 2.0f);
    };
    const index_t half = head_dim / 2;
    for (index_t p = 0; p < ctx; ++p)
      for (index_t c = 0; c < half; ++c) {
        const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(c) / static_cast<double>(half));
        cos.push_back(static_cast<float>(std::cos(angle)));
        sin.push_back(static_cast<float>(std::sin(angle)));
      }
    std::vector<T> prompt(static_cast<std::size_t>(ctx * heads_kv * head_dim));
    for (index_t s = 0; s < b; ++s) {
      for (auto& x : prompt) x = value();
      const auto rows = tileattn::make_bshd<const T>(prompt.data(), 1, ctx, heads_kv, head_dim);
      ids.push_back(cache.create());
      cache.append(ids.back(), rows, rows, rotary());
      positions.push_back(ctx - 1);
    }
    tables = cache.batch(ids);
    q.resize(static_cast<std::size_t>(b * heads_q * head_dim));
    k_new.resize(static_cast<std::size_t>(b * heads_kv * head_dim));
    v_new.resize(k_new.size());
    for (auto* x : {&q, &k_new, &v_new})
      for (auto& e : *x) e = value();
    o.resize(q.size());
  }

  tileattn::RotaryOptions rotary() const {
    const index_t half = head_dim / 2;
    return {{cos.data(), {context, half}, {half, 1}}, {sin.data(), {context, half}, {half, 1}}, false};
  }
  tileattn::StridedView<T, 3> rows(std::vector<T>& x, index_t heads, index_t s) {
    return {x.data() + s * heads * head_dim, {1, heads, head_dim}, {heads * head_dim, head_dim, 1}};
  }
  void step(bool fused) {
    tileattn::PagedOptions opts;
    if (fused) {
      opts.rotary = rotary();
    } else {
      tileattn::apply_rotary(tileattn::StridedView<T, 3>{k_new.data(), {batch, heads_kv, head_dim}, {heads_kv * head_dim, head_dim, 1}},
                             positions, rotary());
      tileattn::apply_rotary(tileattn::StridedView<T, 3>{q.data(), {batch, heads_q, head_dim}, {heads_q * head_dim, head_dim, 1}},
                             positions, rotary());
    }
    const tileattn::RotaryOptions on_write = fused ? rotary() : tileattn::RotaryOptions{};
    for (index_t s = 0; s < batch; ++s)
      cache.write(0, ids[static_cast<std::size_t>(s)], context - 1, rows(k_new, heads_kv, s), rows(v_new, heads_kv, s), on_write);
    tileattn::forward_paged(tileattn::make_bshd<const T>(q.data(), batch, 1, heads_q, head_dim), cache.k_pages(0),
                            cache.v_pages(0), tables.block_table_view(), tables.seqlens(),
                            tileattn::make_bshd(o.data(), batch, 1, heads_q, head_dim), opts);
  }
};

template <class T>
void rotary_step(benchmark::State& state, bool fused) {
  static std::unique_ptr<RotaryStep<T>> cached;
  if (!cached || cached->batch != state.range(0) || cached->context != state.range(1)) {
    cached.reset();
    cached = std::make_unique<RotaryStep<T>>(state.range(0), state.range(1));
  }
  RotaryStep<T>& w = *cached;
  w.step(fused);  // warm
  timed(state, [&] { w.step(fused); });
}

/// Fused and unfused steps alternated on one workload, one of each per iteration: a
/// neighbour's load or a frequency change hits both alike. Reports the medians of each and of
/// the per-iteration ratio unfused / fused (the speedup).
template <class T>
void rotary_step_paired(benchmark::State& state) {
  static std::unique_ptr<RotaryStep<T>> cached;
  if (!cached || cached->batch != state.range(0) || cached->context != state.range(1)) {
    cached.reset();
    cached = std::make_unique<RotaryStep<T>>(state.range(0), state.range(1));
  }
  RotaryStep<T>& w = *cached;
  w.step(true);
  w.step(false);
  std::vector<double> fused, unfused, ratio;
  const auto seconds = [&](bool f) {
    const auto start = tileattn::bench::Clock::now();
    w.step(f);
    return std::chrono::duration<double>(tileattn::bench::Clock::now() - start).count();
  };
  bool fused_first = true;  // alternates: neither always runs on the other's warm caches
  for (auto _ : state) {
    fused_first = !fused_first;
    const double a = seconds(fused_first), b = seconds(!fused_first);
    fused.push_back(fused_first ? a : b);
    unfused.push_back(fused_first ? b : a);
    ratio.push_back(unfused.back() / fused.back());
    state.SetIterationTime(a + b);
  }
  const auto median = [](std::vector<double> x) {
    std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2), x.end());
    return x[x.size() / 2];
  };
  state.counters["fused_us"] = median(fused) * 1e6;
  state.counters["unfused_us"] = median(unfused) * 1e6;
  state.counters["speedup"] = median(ratio);
}

void register_all() {
  const std::vector<std::pair<index_t, index_t>> decodes{{8, 1024}, {8, 4096}, {8, 16384}, {1, 16384}, {1, 65536}};
  for (const auto& [b, ctx] : decodes) {
    benchmark::RegisterBenchmark("decode/fp32", decode<float>)->Args({b, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("decode/bf16", decode<tileattn::bf16>)->Args({b, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (const auto& [b, ctx] : std::vector<std::pair<index_t, index_t>>{{1, 32768}, {8, 16384}})
    benchmark::RegisterBenchmark("topk/bf16", decode_topk<tileattn::bf16>)->Args({b, ctx, 2048})->ArgNames({"B", "ctx", "topk"})->UseManualTime()->Unit(benchmark::kMillisecond);
  // 8-bit caches (bf16 queries), B 8 at 4k and 16k: the quantized-KV goal's rows.
  for (const index_t ctx : {index_t{4096}, index_t{16384}}) {
    benchmark::RegisterBenchmark("decode/int8", decode<tileattn::bf16, std::int8_t>)->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("decode/fp8_e4m3", decode<tileattn::bf16, tileattn::fp8_e4m3>)->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("decode/fp8_e5m2", decode<tileattn::bf16, tileattn::fp8_e5m2>)->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
    // 4-bit caches (issue #33): bytes counted as stored (blocks: values and scales).
    benchmark::RegisterBenchmark("decode/q4_0", decode<tileattn::bf16, tileattn::q4_0_block>)->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("decode/mxfp4", decode<tileattn::bf16, tileattn::mxfp4_block>)->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  const std::vector<std::array<index_t, 3>> verifies{{8, 4096, 4}, {8, 4096, 8}, {1, 4096, 256}};
  for (const auto& v : verifies)
    for (bool paged : {true, false})
      benchmark::RegisterBenchmark(paged ? "verify/paged/fp32" : "verify/contiguous/fp32",
                                   [paged](benchmark::State& s) { verify<float>(s, paged); })
          ->Args({v[0], v[1], v[2]})->ArgNames({"B", "ctx", "q"})->UseManualTime()->Unit(benchmark::kMillisecond);
  // Rotary embedding fused into the cache write and the Q load against a separate pass.
  for (const index_t ctx : {index_t{64}, index_t{512}, index_t{4096}})
    for (bool fused : {true, false}) {
      const std::string name = std::string("rotary_step/") + (fused ? "fused" : "unfused");
      benchmark::RegisterBenchmark((name + "/fp32").c_str(), [fused](benchmark::State& s) { rotary_step<float>(s, fused); })
          ->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((name + "/bf16").c_str(), [fused](benchmark::State& s) { rotary_step<tileattn::bf16>(s, fused); })
          ->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  for (const index_t ctx : {index_t{64}, index_t{512}, index_t{4096}}) {
    benchmark::RegisterBenchmark("rotary_step/paired/fp32", rotary_step_paired<float>)
        ->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("rotary_step/paired/bf16", rotary_step_paired<tileattn::bf16>)
        ->Args({8, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("plan/B:8/ctx:4096", plan_cost)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("decode_with_plan/fp32/B:8/ctx:4096", decode_with_plan)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

// ---- Prefix-once attention: 8 sequences sharing a 16k-token prefix --------------------------

/// B sequences whose block tables start with the same `prefix` tokens' pages (shuffled in the
/// pool with every suffix page), then 100 + 57 b (mod 400) tokens of their own each.
template <class T>
struct SharedPrefixWorkload {
  index_t batch, prefix, max_pages = 0, num_pages = 0;
  std::vector<T, tileattn::LineAlignedAllocator<T>> k_pool, v_pool;
  std::vector<T> q, o;
  std::vector<float> lse;
  std::vector<std::int32_t> table, seqlens;

  SharedPrefixWorkload(index_t b, index_t p) : batch(b), prefix(p) {
    const index_t prefix_pages = p / page_size;  // whole pages (p is a multiple of page_size)
    std::vector<index_t> own(static_cast<std::size_t>(b));
    for (index_t s = 0; s < b; ++s) {
      own[static_cast<std::size_t>(s)] = 100 + (57 * s) % 400;
      seqlens.push_back(static_cast<std::int32_t>(p + own[static_cast<std::size_t>(s)]));
      const index_t pages = (own[static_cast<std::size_t>(s)] + page_size - 1) / page_size;
      max_pages = std::max(max_pages, prefix_pages + pages);
      num_pages += pages;
    }
    num_pages += prefix_pages;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(11));
    table.assign(static_cast<std::size_t>(b * max_pages), 0);
    std::size_t next = static_cast<std::size_t>(prefix_pages);
    for (index_t s = 0; s < b; ++s) {
      std::copy_n(order.begin(), prefix_pages, table.begin() + s * max_pages);
      for (index_t j = prefix_pages; j * page_size < seqlens[static_cast<std::size_t>(s)]; ++j)
        table[static_cast<std::size_t>(s * max_pages + j)] = order[next++];
    }
    k_pool.resize(static_cast<std::size_t>(num_pages * page_size * heads_kv * head_dim));
    v_pool.resize(k_pool.size());
    std::uint32_t state = 777u;
    const auto next_value = [&] {
      state = state * 1664525u + 1013904223u;
      return tileattn::from_float<T>(static_cast<float>(state >> 8) / 4194304.0f - 2.0f);
    };
    for (auto& x : k_pool) x = next_value();
    for (auto& x : v_pool) x = next_value();
    q.resize(static_cast<std::size_t>(b * heads_q * head_dim));
    for (auto& x : q) x = next_value();
    o.resize(q.size());
    lse.resize(static_cast<std::size_t>(b * heads_q));
  }

  void run(bool once) {
    tileattn::PagedOptions opts;
    opts.shared_prefix = once;
    const auto pool = [&](const auto& p) { return tileattn::make_bshd<const T>(p.data(), num_pages, page_size, heads_kv, head_dim); };
    tileattn::forward_paged(tileattn::make_bshd<const T>(q.data(), batch, 1, heads_q, head_dim), pool(k_pool),
                            pool(v_pool), tileattn::make_block_table(table.data(), batch, max_pages), seqlens,
                            tileattn::make_bshd(o.data(), batch, 1, heads_q, head_dim),
                            tileattn::make_lse(lse.data(), batch, heads_q, 1), opts);
  }

  /// K/V bytes of `keys` keys.
  static double bytes(double keys) { return 2.0 * keys * heads_kv * head_dim * sizeof(T); }
  double per_sequence_bytes() const { return bytes(static_cast<double>(std::accumulate(seqlens.begin(), seqlens.end(), std::int64_t{0}))); }
  double once_bytes() const { return per_sequence_bytes() - bytes(static_cast<double>((batch - 1) * prefix)); }
};

template <class T>
void shared_prefix_decode(benchmark::State& state, bool once) {
  static std::unique_ptr<SharedPrefixWorkload<T>> w;
  if (!w || w->batch != state.range(0) || w->prefix != state.range(1)) {
    w.reset();
    w = std::make_unique<SharedPrefixWorkload<T>>(state.range(0), state.range(1));
  }
  w->run(once);  // warm
  timed(state, [&] { w->run(once); });
  const double stream = tileattn::bench::stream_read_gbps(threads());
  const double read = once ? w->once_bytes() : w->per_sequence_bytes();
  state.counters["KV_GB/s"] = benchmark::Counter(read * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_stream"] = benchmark::Counter(read * 1e-9 / stream, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["step_GB/s"] = benchmark::Counter(w->per_sequence_bytes() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_shared_prefix() {
  for (bool once : {true, false}) {
    const std::string path = once ? "once" : "per_sequence";
    benchmark::RegisterBenchmark(("shared_prefix/fp32/" + path).c_str(), [once](benchmark::State& s) { shared_prefix_decode<float>(s, once); })
        ->Args({8, 16384})->ArgNames({"B", "prefix"})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("shared_prefix/bf16/" + path).c_str(), [once](benchmark::State& s) { shared_prefix_decode<tileattn::bf16>(s, once); })
        ->Args({8, 16384})->ArgNames({"B", "prefix"})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

/// An absorbed MLA decode step (mla.hpp): B sequences of `context` bf16 latent rows (576: rank
/// 512 + rotary 64, one latent head, pages of 64), 128 query heads, through forward_paged_mla
/// or the generic call it replaces (forward_paged with V a view of the latent's first 512
/// columns). Paired ratios: benchmarks/side_by_side/mla_timer.cpp.
struct MlaWorkload {
  static constexpr index_t heads = 128, dim = 576, dim_v = 512, page = 64;
  index_t batch, context, pages_per_seq;
  std::vector<tileattn::bf16> q, latent, o;
  std::vector<std::int32_t> table, seqlens;
  MlaWorkload(index_t b, index_t ctx) : batch(b), context(ctx), pages_per_seq((ctx + page - 1) / page) {
    std::mt19937 rng(33);
    std::normal_distribution<float> normal;
    q.resize(static_cast<std::size_t>(b * heads * dim));
    latent.resize(static_cast<std::size_t>(b * pages_per_seq * page * dim));
    for (auto* values : {&q, &latent})
      for (tileattn::bf16& x : *values) x = tileattn::from_float<tileattn::bf16>(normal(rng));
    o.resize(static_cast<std::size_t>(b * heads * dim_v));
    for (index_t s = 0; s < b; ++s) {
      for (index_t p = 0; p < pages_per_seq; ++p) table.push_back(static_cast<std::int32_t>(s * pages_per_seq + p));
      seqlens.push_back(static_cast<std::int32_t>(ctx));
    }
  }
  void run(bool mla) {
    const auto qv = tileattn::make_bshd<const tileattn::bf16>(q.data(), batch, 1, heads, dim);
    const auto pool = tileattn::make_bshd<const tileattn::bf16>(latent.data(), batch * pages_per_seq, page, 1, dim);
    const auto ov = tileattn::make_bshd(o.data(), batch, 1, heads, dim_v);
    const auto bt = tileattn::make_block_table(table.data(), batch, pages_per_seq);
    if (mla) {
      tileattn::forward_paged_mla(qv, pool, bt, seqlens, ov);
    } else {
      auto values = pool;
      values.shape[3] = dim_v;
      tileattn::forward_paged(qv, pool, values, bt, seqlens, ov);
    }
  }
  double flops() const { return 2.0 * heads * double(batch * context) * (dim + dim_v); }
};

void mla_decode(benchmark::State& state, bool mla) {
  static std::unique_ptr<MlaWorkload> w;
  if (!w || w->batch != state.range(0) || w->context != state.range(1)) {
    w.reset();
    w = std::make_unique<MlaWorkload>(state.range(0), state.range(1));
  }
  w->run(mla);  // warm
  timed(state, [&] { w->run(mla); });
  state.counters["GFLOP/s"] = benchmark::Counter(w->flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_mla() {
  for (const bool mla : {true, false})
    for (const auto& [b, ctx] : std::vector<std::pair<index_t, index_t>>{{1, 4096}, {4, 8192}})
      benchmark::RegisterBenchmark(mla ? "mla_decode/bf16/mla" : "mla_decode/bf16/generic",
                                   [mla](benchmark::State& s) { mla_decode(s, mla); })
          ->Args({b, ctx})->ArgNames({"B", "ctx"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  register_shared_prefix();
  register_mla();
  benchmark::AddCustomContext("threads", std::to_string(threads()));
  benchmark::AddCustomContext("stream_read_GB/s", std::to_string(tileattn::bench::stream_read_gbps(threads())));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
