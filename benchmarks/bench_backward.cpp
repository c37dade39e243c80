// benchmarks/bench_backward.cpp: the backward pass in one run: tileattn's forward alone, its
// backward alone and forward + backward, in fp32 and bf16, against the machine's ceilings
// (register-resident FMA loop and vdpbf16ps loop, measured in this process) and next to a
// standard-attention backward built on Eigen GEMMs (standard_attention_backward.hpp, fp32).
// At the end it prints, per workload, the GFLOP/s of each kind, the backward's fraction of
// the FMA loop, its speed-up over the Eigen backward, and bf16 against fp32 and against the
// vdpbf16ps loop, all of this run.
//
// Workloads: batch 1, N = seqlen_q = seqlen_k = 2048: 16 heads d 128 non-causal and 16 heads
// d 64 causal (the backward issue's two shapes), and 4 heads d 128 non-causal (few heads:
// fewer K/V streams to spread over the cores). Every kind runs on the default Execution (all
// hardware threads; OMP_NUM_THREADS limits the kernels and the ceilings alike).
//
// FLOPs, credited to every implementation whatever work it does (halved when causal):
//   forward     4 * B * H * Nq * Nk * d      (QK^T and PV)
//   backward    2.5 times the forward's      (QK^T recomputed, dV, dP, dQ, dK: the
//                                             FlashAttention papers' count)
//   fwd + bwd   3.5 times the forward's
// bf16 rows use the fp32 workload's inputs (N(0, 1), fixed seeds) rounded to bf16 once,
// outside the timing; O and the LSE the backward reads come from one untimed forward of the
// same type and options.
//
// Counters, per benchmark:
//   GFLOP/s     FLOPs above per second of real time
//   of_fma      GFLOP/s over the FMA loop's (fp32 peak) on the same threads (wall time of
//               the timed loop, taken around it: a plain counter, not a rate)
//   of_bf16dot  bf16 rows only: GFLOP/s over the vdpbf16ps loop's (absent without AVX-512 BF16)
//   HBM_bytes   backward rows only: bytes one tileattn backward call moves between main
//               memory and SRAM, counted by an untimed call with BackwardOptions::io_counts
//   HBM_GB/s    HBM_bytes per second of real time
//
//   bench_backward                                   # every workload (minutes on few cores)
//   bench_backward --benchmark_filter=H:4/           # one workload
//   bench_backward --benchmark_filter=bwd_           # the backward rows only
//   bench_backward --benchmark_format=json --benchmark_out=backward.json   # ceilings in "context"
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ceilings.hpp"
#include "standard_attention_backward.hpp"
#include "tileattn/tileattn.hpp"
#include "workload.hpp"

namespace {

using tileattn::index_t;
using tileattn::bench::AttentionShape;
using tileattn::bench::AttentionWorkload;

struct Ceilings {
  int threads;
  double fma_gflops;
  double bf16_dot_gflops;  // 0 where the CPU has no AVX-512 BF16
};

Ceilings& ceilings() {
  static Ceilings c{};
  return c;
}

const std::vector<AttentionShape>& workloads() {
  static const std::vector<AttentionShape> shapes{
      {1, 16, 2048, 2048, 128, false},
      {1, 16, 2048, 2048, 64, true},
      {1, 4, 2048, 2048, 128, false},
  };
  return shapes;
}

std::string shape_name(const AttentionShape& s) {
  return "H:" + std::to_string(s.heads) + "/N:" + std::to_string(s.seqlen_q) + "/d:" + std::to_string(s.head_dim) +
         "/causal:" + std::to_string(s.causal ? 1 : 0);
}

/// What one timed iteration runs, and its FLOPs as multiples of the forward's.
enum class Pass { forward, backward, forward_backward };

double flop_factor(Pass pass) {
  switch (pass) {
    case Pass::forward: return 1.0;
    case Pass::backward: return 2.5;
    case Pass::forward_backward: return 3.5;
  }
  return 0.0;
}

/// Runs the timed loop; returns its wall time in seconds (the fractions of the ceilings are
/// plain counters computed from it, so they do not print as rates).
template <class Body>
double timed_loop(benchmark::State& state, Body body) {
  const auto start = tileattn::bench::Clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  return std::chrono::duration<double>(tileattn::bench::Clock::now() - start).count();
}

template <class T>
void set_counters(benchmark::State& state, const AttentionShape& shape, Pass pass, double seconds) {
  using benchmark::Counter;
  const Ceilings& c = ceilings();
  const double gflop = shape.flops() * flop_factor(pass) * 1e-9;
  state.counters["GFLOP/s"] = Counter(gflop, Counter::kIsIterationInvariantRate);
  const double gflops = seconds > 0 ? gflop * static_cast<double>(state.iterations()) / seconds : 0.0;
  if (c.fma_gflops > 0) state.counters["of_fma"] = Counter(gflops / c.fma_gflops);
  if (std::is_same_v<T, tileattn::bf16> && c.bf16_dot_gflops > 0)
    state.counters["of_bf16dot"] = Counter(gflops / c.bf16_dot_gflops);
}

/// One backward problem in storage type T: Q, K, V, dO (the fp32 N(0, 1) inputs rounded to
/// T), O and the LSE of one untimed forward with the shape's options, gradient buffers.
template <class T>
struct BackwardWorkload {
  AttentionShape shape;
  std::vector<T> q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;

  explicit BackwardWorkload(const AttentionShape& s) : shape(s) {
    const auto round = [](const std::vector<float>& x) {
      std::vector<T> r(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) r[i] = tileattn::from_float<T>(x[i]);
      return r;
    };
    {
      const AttentionWorkload w(s);  // Q, K, V as bench_forward's and bench_gap's
      q = round(w.q);
      k = round(w.k);
      v = round(w.v);
      std::vector<float> g(w.o.size());
      std::mt19937 rng(2027);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : g) x = normal(rng);
      dout = round(g);
    }
    o.assign(q.size(), T{});
    dq.assign(q.size(), T{});
    dk.assign(k.size(), T{});
    dv.assign(v.size(), T{});
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q), 0.0f);
    tileattn::forward(in(q, s.seqlen_q), in(k, s.seqlen_k), in(v, s.seqlen_k), out(o, s.seqlen_q), lse_view(),
                      forward_options());
  }

  tileattn::ForwardOptions forward_options() const {
    tileattn::ForwardOptions opts;
    opts.causal = shape.causal;
    return opts;
  }
  tileattn::BackwardOptions backward_options() const {
    return tileattn::BackwardOptions(forward_options());
  }

  tileattn::TensorView<const T> in(const std::vector<T>& x, index_t seqlen) const {
    return tileattn::make_bshd<const T>(x.data(), shape.batch, seqlen, shape.heads, shape.head_dim);
  }
  tileattn::TensorView<T> out(std::vector<T>& x, index_t seqlen) {
    return tileattn::make_bshd(x.data(), shape.batch, seqlen, shape.heads, shape.head_dim);
  }
  tileattn::LseView lse_view() { return tileattn::make_lse(lse.data(), shape.batch, shape.heads, shape.seqlen_q); }

  void forward() {
    tileattn::forward(in(q, shape.seqlen_q), in(k, shape.seqlen_k), in(v, shape.seqlen_k), out(o, shape.seqlen_q),
                      lse_view(), forward_options());
  }
  void backward(const tileattn::BackwardOptions& opts) {
    tileattn::backward(in(q, shape.seqlen_q), in(k, shape.seqlen_k), in(v, shape.seqlen_k), in(o, shape.seqlen_q),
                       lse_view(), in(dout, shape.seqlen_q), out(dq, shape.seqlen_q), out(dk, shape.seqlen_k),
                       out(dv, shape.seqlen_k), opts);
  }
};

bool same_problem(const AttentionShape& a, const AttentionShape& b) {
  return a.batch == b.batch && a.heads == b.heads && a.seqlen_q == b.seqlen_q && a.seqlen_k == b.seqlen_k &&
         a.head_dim == b.head_dim && a.causal == b.causal;
}

/// Benchmarks are registered so that consecutive ones share a workload: this one-entry cache
/// per storage type builds it once, outside every timed loop (O and the LSE depend on the mask).
template <class T>
BackwardWorkload<T>& workload_for(const AttentionShape& shape) {
  static std::unique_ptr<BackwardWorkload<T>> cached;
  if (!cached || !same_problem(cached->shape, shape)) {
    cached.reset();  // free the old buffers before allocating the new ones
    cached = std::make_unique<BackwardWorkload<T>>(shape);
  }
  return *cached;
}

std::string plan_label(const AttentionShape& s, const tileattn::BackwardOptions& opts) {
  const tileattn::BackwardTilePlan plan =
      tileattn::backward_tiles({s.head_dim, s.head_dim, s.seqlen_q, s.seqlen_k, s.batch * s.heads}, opts);
  return "Br=" + std::to_string(plan.query_tile_rows) + " Bc=" + std::to_string(plan.key_tile_rows);
}

template <class T>
void bm_forward(benchmark::State& state, AttentionShape shape) {
  BackwardWorkload<T>& w = workload_for<T>(shape);
  w.forward();  // warm-up
  const double seconds = timed_loop(state, [&] {
    w.forward();
    benchmark::DoNotOptimize(w.o.data());
  });
  set_counters<T>(state, shape, Pass::forward, seconds);
}

template <class T>
void bm_backward(benchmark::State& state, AttentionShape shape) {
  BackwardWorkload<T>& w = workload_for<T>(shape);
  tileattn::BackwardOptions opts = w.backward_options();
  // One untimed call with IO counting: the byte counter, and a warm-up.
  tileattn::IoCounts io;
  opts.io_counts = &io;
  w.backward(opts);
  opts.io_counts = nullptr;
  const double seconds = timed_loop(state, [&] {
    w.backward(opts);
    benchmark::DoNotOptimize(w.dq.data());
  });
  set_counters<T>(state, shape, Pass::backward, seconds);
  const double bytes = static_cast<double>(io.bytes_read + io.bytes_written);
  state.counters["HBM_bytes"] = benchmark::Counter(bytes);
  state.counters["HBM_GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(plan_label(shape, opts));
}

template <class T>
void bm_forward_backward(benchmark::State& state, AttentionShape shape) {
  BackwardWorkload<T>& w = workload_for<T>(shape);
  const tileattn::BackwardOptions opts = w.backward_options();
  w.forward();  // warm-up
  w.backward(opts);
  const double seconds = timed_loop(state, [&] {
    w.forward();
    w.backward(opts);
    benchmark::DoNotOptimize(w.dq.data());
  });
  set_counters<T>(state, shape, Pass::forward_backward, seconds);
}

void bm_eigen_backward(benchmark::State& state, AttentionShape shape) {
  BackwardWorkload<float>& w = workload_for<float>(shape);  // O, LSE from tileattn's fp32 forward
  static tileattn::bench::StandardAttentionBackward standard;  // per-worker workspaces, kept
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const auto run = [&] {
    standard(w.in(w.q, shape.seqlen_q), w.in(w.k, shape.seqlen_k), w.in(w.v, shape.seqlen_k),
             w.in(w.o, shape.seqlen_q), w.lse_view(), w.in(w.dout, shape.seqlen_q), w.out(w.dq, shape.seqlen_q),
             w.out(w.dk, shape.seqlen_k), w.out(w.dv, shape.seqlen_k), scale, shape.causal);
  };
  run();  // untimed warm-up: sizes the workspaces (P and dS are N*N floats each per worker)
  const double seconds = timed_loop(state, [&] {
    run();
    benchmark::DoNotOptimize(w.dq.data());
  });
  set_counters<float>(state, shape, Pass::backward, seconds);
  state.SetLabel("eigen");
}

/// Prints the console table as usual, then the ratios, from the counters of this run.
class BackwardReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.counters.count("GFLOP/s") == 0) continue;
      const std::string name = run.run_name.function_name;  // kind/H:../N:../d:../causal:..
      const auto slash = name.find('/');
      gflops_[name.substr(slash + 1)][name.substr(0, slash)] = run.counters.at("GFLOP/s").value;
    }
    ConsoleReporter::ReportRuns(runs);
  }

  /// GFLOP/s of tileattn fp32 (fwd, bwd, fwd+bwd), the Eigen backward, tileattn bf16; then
  /// ratios, all of this run: "-" where a kind did not run (filtered out) or the ceiling is
  /// missing.
  void Finalize() override {
    ConsoleReporter::Finalize();
    const Ceilings& c = ceilings();
    std::printf("\nCeilings, %d threads: FMA loop %.1f GFLOP/s, vdpbf16ps loop ", c.threads, c.fma_gflops);
    if (c.bf16_dot_gflops > 0) std::printf("%.1f GFLOP/s\n", c.bf16_dot_gflops);
    else std::printf("n/a (no AVX-512 BF16)\n");
    std::printf("%-28s %7s %7s %7s %7s %7s %9s %7s %7s %7s %9s %9s %8s\n", "workload", "fwd", "bwd", "f+b",
                "eigen", "bwd/fma", "bwd/eigen", "bf16 f", "bf16 b", "bf16 fb", "bwd b/f32", "f+b b/f32",
                "bwd/dot");
    const auto col = [](int width, int precision, double x) {
      if (x > 0) std::printf(" %*.*f", width, precision, x);
      else std::printf(" %*s", width, "-");
    };
    const auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
    for (const auto& [shape, by_kind] : gflops_) {
      const auto get = [&](const char* k) { auto it = by_kind.find(k); return it == by_kind.end() ? 0.0 : it->second; };
      const double f = get("fwd_tileattn"), b = get("bwd_tileattn"), fb = get("fwdbwd_tileattn");
      const double e = get("bwd_std_eigen");
      const double hf = get("fwd_tileattn_bf16"), hb = get("bwd_tileattn_bf16"), hfb = get("fwdbwd_tileattn_bf16");
      std::printf("%-28s", shape.c_str());
      col(7, 1, f), col(7, 1, b), col(7, 1, fb), col(7, 1, e);
      col(7, 2, ratio(b, c.fma_gflops)), col(9, 2, ratio(b, e));
      col(7, 1, hf), col(7, 1, hb), col(7, 1, hfb);
      col(9, 2, ratio(hb, b)), col(9, 2, ratio(hfb, fb)), col(8, 2, ratio(hb, c.bf16_dot_gflops));
      std::printf("\n");
    }
    std::printf("GFLOP/s credit the backward with 2.5x the forward's FLOPs, fwd+bwd with 3.5x; "
                "b/f32: bf16 over fp32 GFLOP/s; bwd/dot: bf16 backward over the vdpbf16ps loop\n");
  }

 private:
  std::map<std::string, std::map<std::string, double>> gflops_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Ceilings& c = ceilings();
  c.threads = tileattn::worker_count(tileattn::Execution{});
  c.fma_gflops = tileattn::bench::fma_peak_gflops(c.threads);
  c.bf16_dot_gflops = tileattn::bench::bf16_dot_peak_gflops(c.threads);
  benchmark::AddCustomContext("threads", std::to_string(c.threads));
  benchmark::AddCustomContext("fma_peak_gflops", std::to_string(c.fma_gflops));
  benchmark::AddCustomContext("bf16_dot_peak_gflops", std::to_string(c.bf16_dot_gflops));

  using Bench = void (*)(benchmark::State&, AttentionShape);
  // fp32 kinds, then bf16, then the baseline (which reuses the fp32 workload): each storage
  // type's workload is built once per shape.
  const std::vector<std::pair<const char*, Bench>> kinds{
      {"fwd_tileattn", &bm_forward<float>},
      {"bwd_tileattn", &bm_backward<float>},
      {"fwdbwd_tileattn", &bm_forward_backward<float>},
      {"fwd_tileattn_bf16", &bm_forward<tileattn::bf16>},
      {"bwd_tileattn_bf16", &bm_backward<tileattn::bf16>},
      {"fwdbwd_tileattn_bf16", &bm_forward_backward<tileattn::bf16>},
      {"bwd_std_eigen", &bm_eigen_backward},
  };
  for (const AttentionShape& s : workloads())
    for (auto [kind, fn] : kinds)
      benchmark::RegisterBenchmark((std::string(kind) + "/" + shape_name(s)).c_str(), fn, s)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  BackwardReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
