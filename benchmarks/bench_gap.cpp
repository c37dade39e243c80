// benchmarks/bench_gap.cpp: the gap, in one run: tileattn's forward against the machine's
// ceilings (register-resident FMA loop, OpenBLAS sgemm 2048^3, streaming read) and against
// standard attention on OpenBLAS and on Eigen (both written carefully: heads in parallel,
// single-threaded BLAS per head, vectorized exp). At the end it prints each kernel's
// fraction of the sgemm rate and tileattn's speed-up over each baseline.
//
//   bench_gap                                  # all workloads of issue #3's goals
//   bench_gap --benchmark_filter=N:2048        # one size
//   bench_gap --benchmark_format=json --benchmark_out=gap.json   # ceilings go in "context"
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
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
};

Ceilings& ceilings() {
  static Ceilings c{};
  return c;
}

/// The workloads of the goals: (N, d, causal) at batch 1, 16 heads.
const std::vector<AttentionShape>& workloads() {
  static const std::vector<AttentionShape> shapes{
      {1, 16, 2048, 2048, 128, false}, {1, 16, 2048, 2048, 128, true},
      {1, 16, 4096, 4096, 64, true},   {1, 16, 4096, 4096, 128, false},
      {1, 16, 8192, 8192, 128, false},
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

void bm_tileattn(benchmark::State& state, AttentionShape shape) {
  AttentionWorkload w(shape);
  tileattn::ForwardOptions opts;
  opts.causal = shape.causal;
  for (auto _ : state)
    tileattn::forward(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), opts);
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

  void Finalize() override {
    ConsoleReporter::Finalize();
    const Ceilings& c = ceilings();
    std::printf("\nCeilings, %d threads: FMA loop %.1f GFLOP/s, sgemm 2048^3 %.1f GFLOP/s, "
                "streaming read %.1f GB/s\n", c.threads, c.fma_gflops, c.sgemm_gflops, c.read_gbps);
    std::printf("%-26s %10s %10s %10s %9s %9s %9s\n", "workload", "tileattn", "blas", "eigen",
                "tile/sgemm", "tile/blas", "tile/eigen");
    for (const auto& [shape, by_kind] : gflops_) {
      const auto get = [&](const char* k) { auto it = by_kind.find(k); return it == by_kind.end() ? 0.0 : it->second; };
      const double t = get("fwd_tileattn"), b = get("std_blas"), e = get("std_eigen");
      std::printf("%-26s %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f\n", shape.c_str(), t, b, e,
                  t / c.sgemm_gflops, b > 0 ? t / b : 0.0, e > 0 ? t / e : 0.0);
    }
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
  benchmark::AddCustomContext("threads", std::to_string(c.threads));
  benchmark::AddCustomContext("fma_peak_gflops", std::to_string(c.fma_gflops));
  benchmark::AddCustomContext("sgemm_2048_gflops", std::to_string(c.sgemm_gflops));
  benchmark::AddCustomContext("stream_read_gbps", std::to_string(c.read_gbps));

  for (const AttentionShape& s : workloads()) {
    const bool big = s.seqlen_q >= 8192;
    for (auto [kind, fn] : {std::pair{"fwd_tileattn", &bm_tileattn}, {"std_blas", &bm_blas}, {"std_eigen", &bm_eigen}}) {
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
