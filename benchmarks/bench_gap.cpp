// benchmarks/bench_gap.cpp: the gap, in one run: tileattn's forward against the machine's
// ceilings (register-resident FMA loop, OpenBLAS sgemm 2048^3, streaming read) and against
// standard attention on OpenBLAS and on Eigen (both written carefully: heads in parallel,
// single-threaded BLAS per head, vectorized exp). At the end it prints each kernel's
// fraction of the sgemm rate and tileattn's speed-up over each baseline, and tileattn's bf16
// and fp16 forwards (the same inputs rounded to the type) against its fp32 forward of the
// same run and, for bf16, against a register-resident vdpbf16ps loop.
//
//   bench_gap                                  # all workloads of issue #3's goals
//   bench_gap --benchmark_filter=N:2048        # one size
//   bench_gap --benchmark_format=json --benchmark_out=gap.json   # ceilings go in "context"
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "blas_attention.hpp"
#include "sgemm_ceiling.hpp"
#include "standard_attention.hpp"
#include "tileattn/tileattn.hpp"
#include "workload.hpp"

namespace {

using tileattn::index_t;
using tileattn::bench::AttentionShape;
using tileattn::bench::AttentionWorkload;

struct Ceilings {
  int threads;
  double fma_gflops, sgemm_gflops, read_gbps;
  double bf16_dot_gflops;  // 0 where the CPU has no AVX-512 BF16
};

Ceilings& ceilings() {
  static Ceilings c{};
  return c;
}

struct GapWorkload {
  AttentionShape shape;
  bool baselines = true;  // also time standard attention on OpenBLAS and Eigen
};

/// The workloads of the goals: (N, d, causal) at batch 1, 16 heads. N 8192 causal is only
/// there for the bf16 and fp16 goals (tileattn's kernels only: the baselines' 8192 rows are
/// slow and the non-causal one already shows their gap).
const std::vector<GapWorkload>& workloads() {
  static const std::vector<GapWorkload> shapes{
      {{1, 16, 2048, 2048, 128, false}}, {{1, 16, 2048, 2048, 128, true}},
      {{1, 16, 4096, 4096, 64, true}},   {{1, 16, 4096, 4096, 128, false}},
      {{1, 16, 8192, 8192, 128, false}}, {{1, 16, 8192, 8192, 128, true}, false},
  };
  return shapes;
}

std::string shape_name(const AttentionShape& s) {
  return "N:" + std::to_string(s.seqlen_q) + "/d:" + std::to_string(s.head_dim) +
         "/causal:" + std::to_string(s.causal ? 1 : 0);
}

void set_counters(benchmark::State& state, const AttentionShape& shape) {
  using benchmark::Counter;
  state.counters["GFLOP/s"] = Counter(shape.flops() * 1e-9, Counter::kIsIterationInvariantRate);
}

/// The fp32 workload's inputs (N(0, 1), same seed) rounded to T, O in T, the LSE in float.
template <class T>
struct TypedWorkload {
  AttentionShape shape;
  std::vector<T> q, k, v, o;
  std::vector<float> lse;

  explicit TypedWorkload(const AttentionShape& s) : shape(s) {
    const AttentionWorkload w(s);
    const auto round = [](const std::vector<float>& x) {
      std::vector<T> r(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) r[i] = tileattn::from_float<T>(x[i]);
      return r;
    };
    q = round(w.q);
    k = round(w.k);
    v = round(w.v);
    o = round(w.o);
    lse = w.lse;
  }

  tileattn::TensorView<const T> in(const std::vector<T>& x, index_t seqlen) const {
    return tileattn::make_bshd<const T>(x.data(), shape.batch, seqlen, shape.heads, shape.head_dim);
  }
};

template <class T>
void bm_tileattn(benchmark::State& state, AttentionShape shape) {
  TypedWorkload<T> w(shape);
  const auto q = w.in(w.q, shape.seqlen_q), k = w.in(w.k, shape.seqlen_k), v = w.in(w.v, shape.seqlen_k);
  const auto o = tileattn::make_bshd(w.o.data(), shape.batch, shape.seqlen_q, shape.heads, shape.head_dim);
  const auto lse = tileattn::make_lse(w.lse.data(), shape.batch, shape.heads, shape.seqlen_q);
  tileattn::ForwardOptions opts;
  opts.causal = shape.causal;
  for (auto _ : state) tileattn::forward(q, k, v, o, lse, opts);
  set_counters(state, shape);
}

void bm_blas(benchmark::State& state, AttentionShape shape) {
  AttentionWorkload w(shape);
  const tileattn::Execution exec{};
  tileattn::bench::BlasAttention blas(shape.seqlen_q, shape.seqlen_k, shape.head_dim,
                                      tileattn::worker_count(exec));
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  for (auto _ : state) blas.run(w.q_view(), w.k_view(), w.v_view(), w.o_view(), scale, shape.causal, exec);
  set_counters(state, shape);
}

void bm_eigen(benchmark::State& state, AttentionShape shape) {
  AttentionWorkload w(shape);
  tileattn::bench::StandardAttention eigen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  for (auto _ : state)
    eigen(w.q_view(), w.k_view(), w.v_view(), w.o_view(), tileattn::LseView{}, scale, shape.causal);
  set_counters(state, shape);
}

/// Prints the console table as usual, then the ratios, from the counters of this run.
class GapReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.counters.count("GFLOP/s") == 0) continue;
      const std::string name = run.run_name.function_name;  // kind/N:../d:../causal:..
      const auto slash = name.find('/');
      gflops_[name.substr(slash + 1)][name.substr(0, slash)] = run.counters.at("GFLOP/s").value;
    }
    ConsoleReporter::ReportRuns(runs);
  }

  /// GFLOP/s columns are tileattn fp32, standard attention on OpenBLAS and Eigen, tileattn
  /// bf16 and fp16; then ratios, all of this run: "-" where a kind did not run (filtered out,
  /// or a workload without baselines) or the ceiling is missing.
  void Finalize() override {
    ConsoleReporter::Finalize();
    const Ceilings& c = ceilings();
    std::printf("\nCeilings, %d threads: FMA loop %.1f GFLOP/s, sgemm 2048^3 %.1f GFLOP/s, "
                "streaming read %.1f GB/s, vdpbf16ps loop ", c.threads, c.fma_gflops, c.sgemm_gflops, c.read_gbps);
    if (c.bf16_dot_gflops > 0) std::printf("%.1f GFLOP/s\n", c.bf16_dot_gflops);
    else std::printf("n/a (no AVX-512 BF16)\n");
    std::printf("%-26s %9s %9s %9s %10s %10s %10s %9s %9s %9s %9s %9s\n", "workload", "tileattn", "blas", "eigen",
                "tile/sgemm", "tile/blas", "tile/eigen", "bf16", "fp16", "bf16/fp32", "fp16/fp32", "bf16/dot");
    const auto col = [](int width, int precision, double x) {
      if (x > 0) std::printf(" %*.*f", width, precision, x);
      else std::printf(" %*s", width, "-");
    };
    const auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
    for (const auto& [shape, by_kind] : gflops_) {
      const auto get = [&](const char* k) { auto it = by_kind.find(k); return it == by_kind.end() ? 0.0 : it->second; };
      const double t = get("fwd_tileattn"), b = get("std_blas"), e = get("std_eigen");
      const double h = get("fwd_tileattn_bf16"), f = get("fwd_tileattn_fp16");
      std::printf("%-26s", shape.c_str());
      col(9, 1, t), col(9, 1, b), col(9, 1, e);
      col(10, 2, ratio(t, c.sgemm_gflops)), col(10, 2, ratio(t, b)), col(10, 2, ratio(t, e));
      col(9, 1, h), col(9, 1, f);
      col(9, 2, ratio(h, t)), col(9, 2, ratio(f, t)), col(9, 2, ratio(h, c.bf16_dot_gflops));
      std::printf("\n");
    }
    std::printf("bf16/dot: bf16 GFLOP/s over the vdpbf16ps loop's; goals (d 128, N 2048 and 8192): "
                "bf16/fp32 >= 1.6, bf16/dot >= 0.75, fp16/fp32 >= 0.9\n");
  }

 private:
  std::map<std::string, std::map<std::string, double>> gflops_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Ceilings& c = ceilings();
  c.threads = tileattn::worker_count(tileattn::Execution{});
  c.sgemm_gflops = tileattn::bench::sgemm_gflops(c.threads);
  c.fma_gflops = tileattn::bench::fma_peak_gflops(c.threads);
  c.read_gbps = tileattn::bench::stream_read_gbps(c.threads);
  c.bf16_dot_gflops = tileattn::bench::bf16_dot_peak_gflops(c.threads);
  benchmark::AddCustomContext("threads", std::to_string(c.threads));
  benchmark::AddCustomContext("fma_peak_gflops", std::to_string(c.fma_gflops));
  benchmark::AddCustomContext("sgemm_2048_gflops", std::to_string(c.sgemm_gflops));
  benchmark::AddCustomContext("stream_read_gbps", std::to_string(c.read_gbps));
  benchmark::AddCustomContext("bf16_dot_peak_gflops", std::to_string(c.bf16_dot_gflops));

  using Bench = void (*)(benchmark::State&, AttentionShape);
  const std::vector<std::pair<const char*, Bench>> tileattn_kinds{
      {"fwd_tileattn", &bm_tileattn<float>},
      {"fwd_tileattn_bf16", &bm_tileattn<tileattn::bf16>},
      {"fwd_tileattn_fp16", &bm_tileattn<tileattn::fp16>}};
  const std::vector<std::pair<const char*, Bench>> baseline_kinds{{"std_blas", &bm_blas}, {"std_eigen", &bm_eigen}};
  for (const auto& [s, baselines] : workloads()) {
    const bool big = s.seqlen_q >= 8192;
    auto kinds = tileattn_kinds;
    if (baselines) kinds.insert(kinds.end(), baseline_kinds.begin(), baseline_kinds.end());
    for (auto [kind, fn] : kinds) {
      auto* b = benchmark::RegisterBenchmark((std::string(kind) + "/" + shape_name(s)).c_str(), fn, s);
      b->UseRealTime()->Unit(benchmark::kMillisecond);
      if (big) b->Iterations(1);
      else b->MinTime(0.5);
    }
  }
  GapReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
