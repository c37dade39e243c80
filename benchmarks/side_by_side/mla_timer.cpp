// benchmarks/side_by_side/mla_timer.cpp: issue #33's MLA decode (forward_paged_mla, mla.hpp)
// against the generic path it replaces, paired in one process: forward_paged with heads_kv 1
// and the V pool a view of the latent pool's first 512 columns (same data, same strides).
// Each repetition runs both, alternating which goes first; printed per workload: the median
// and min-max of each, the median and min-max of the per-repetition ratios generic / MLA
// (> 1: MLA faster), MLA's GFLOP/s (Hq x keys x (576 + 512) x 2 FLOPs: Q K^T and P V) and the
// bytes each path reads per latent byte (IO counters), and the plan (rows and keys of a work
// item's tiles, whether the bf16 products run on prepared panels: AMX tiles on the Xeon). No Google Benchmark, so it builds on
// the lent Xeon with g++ alone:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/mla_timer.cpp -o t
//   ./t [THREADS] [REPEATS] [HEADS]     (THREADS default: OMP_NUM_THREADS, else all; REPEATS 9;
//                                        HEADS 128)
//
// Workloads: a decode step (seqlen_q 1) of batch 1, 2, 4 sequences of 1k, 4k, 8k keys each,
// bf16 latent cache [pages of 64, heads_kv 1, 576], bf16 Q [B, 1, Hq, 576], O [B, 1, Hq, 512].
// Target (issue #33): >= 3x the generic path at 128 heads.
#include <tileattn/tileattn.hpp>

#include "timing.hpp"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using side_by_side::seconds;
using side_by_side::median;

using tileattn::bf16;
using tileattn::index_t;
constexpr index_t rank = 512, rope = 64, dim = rank + rope, page = 64;

std::string ms(const std::vector<double>& v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%7.3f ms (%.3f-%.3f)", median(v) * 1e3, *std::min_element(v.begin(), v.end()) * 1e3,
                *std::max_element(v.begin(), v.end()) * 1e3);
  return buf;
}

/// A decode step's inputs: `batch` sequences of `keys` latent rows each, pages in order.
struct Step {
  index_t batch, keys, heads, pages_per_seq;
  std::vector<bf16> q, latent, o;
  std::vector<std::int32_t> table, seqlens;

  Step(index_t b, index_t k, index_t h) : batch(b), keys(k), heads(h), pages_per_seq((k + page - 1) / page) {
    std::mt19937 rng(static_cast<unsigned>(b * 7919 + k));
    std::normal_distribution<float> normal;
    q.resize(static_cast<std::size_t>(b * h * dim));
    latent.resize(static_cast<std::size_t>(b * pages_per_seq * page * dim));
    for (bf16& x : q) x = tileattn::from_float<bf16>(normal(rng));
    for (bf16& x : latent) x = tileattn::from_float<bf16>(normal(rng));
    o.resize(static_cast<std::size_t>(b * h * rank));
    for (index_t s = 0; s < b; ++s) {
      for (index_t p = 0; p < pages_per_seq; ++p) table.push_back(static_cast<std::int32_t>(s * pages_per_seq + p));
      seqlens.push_back(static_cast<std::int32_t>(k));
    }
  }
  auto queries() const { return tileattn::make_bshd<const bf16>(q.data(), batch, 1, heads, dim); }
  auto pool() const { return tileattn::make_bshd<const bf16>(latent.data(), batch * pages_per_seq, page, 1, dim); }
  auto values() const {  // the generic path's V: the latent's first 512 columns, a view
    auto v = pool();
    v.shape[3] = rank;
    return v;
  }
  auto out() { return tileattn::make_bshd(o.data(), batch, 1, heads, rank); }
  auto block_table() const { return tileattn::make_block_table(table.data(), batch, pages_per_seq); }
  void generic(const tileattn::PagedOptions& opt) {
    tileattn::forward_paged(queries(), pool(), values(), block_table(), seqlens, out(), opt);
  }
  void mla(const tileattn::PagedOptions& opt) {
    tileattn::forward_paged_mla(queries(), pool(), block_table(), seqlens, out(), opt);
  }
  double latent_bytes() const { return double(batch * keys * dim * sizeof(bf16)); }
};

/// MLA's output against attention in double over the same bf16 inputs (one sequence):
/// the largest absolute difference over every head and value column.
double max_error_against_double(const Step& step) {
  const double scale = 1.0 / std::sqrt(double(dim));
  double worst = 0;
  std::vector<double> p(static_cast<std::size_t>(step.keys));
  for (index_t h = 0; h < step.heads; ++h) {
    const bf16* qh = step.q.data() + h * dim;
    double top = -1e300;
    for (index_t j = 0; j < step.keys; ++j) {
      const bf16* kj = step.latent.data() + j * dim;
      double s = 0;
      for (index_t c = 0; c < dim; ++c) s += double(tileattn::to_float(qh[c])) * double(tileattn::to_float(kj[c]));
      p[j] = s * scale, top = std::max(top, p[j]);
    }
    double sum = 0;
    for (double& x : p) sum += (x = std::exp(x - top));
    for (index_t c = 0; c < rank; ++c) {
      double acc = 0;
      for (index_t j = 0; j < step.keys; ++j) acc += p[j] * double(tileattn::to_float(step.latent[j * dim + c]));
      worst = std::max(worst, std::abs(acc / sum - double(tileattn::to_float(step.o[h * rank + c]))));
    }
  }
  return worst;
}

void compare(index_t batch, index_t keys, index_t heads, int threads, int repeats) {
  Step step(batch, keys, heads);
  tileattn::PagedOptions opt;
  opt.execution.num_threads = threads;
  tileattn::IoCounts generic_io, mla_io;
  tileattn::PagedOptions counted = opt;
  counted.io_counts = &generic_io;
  step.generic(counted);
  const std::vector<bf16> generic_o = step.o;
  counted.io_counts = &mla_io;
  step.mla(counted);
  const bool same_bits = std::memcmp(generic_o.data(), step.o.data(), generic_o.size() * sizeof(bf16)) == 0;
  const double error = batch == 1 && keys == 1024 ? max_error_against_double(step) : -1.0;
  std::vector<double> tg, tm, ratio;
  for (int r = 0; r < repeats; ++r) {
    double g = 0, m = 0;
    if (r % 2) m = seconds([&] { step.mla(opt); }), g = seconds([&] { step.generic(opt); });
    else g = seconds([&] { step.generic(opt); }), m = seconds([&] { step.mla(opt); });
    tg.push_back(g), tm.push_back(m), ratio.push_back(g / m);
  }
  const double flops = 2.0 * double(heads) * double(batch * keys) * double(dim + rank);
  const tileattn::PagedPlan plan = tileattn::plan_forward_paged_mla(step.queries(), step.pool(), step.block_table(),
                                                                    step.seqlens, step.out(), tileattn::LseView{}, opt);
  const tileattn::TilePlan& t = plan.tiles();
  std::printf("B %d keys %5td Hq %3td threads %2d  generic %s  mla %s  ratio %.3f (%.3f-%.3f) of %d  mla %6.1f GFLOP/s"
              "  read/latent generic %.2f mla %.2f  plan: %td heads x %td keys%s, split %td\n",
              int(batch), keys, heads, threads, ms(tg).c_str(), ms(tm).c_str(), median(ratio),
              *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()), repeats,
              flops / median(tm) / 1e9, double(generic_io.bytes_read) / step.latent_bytes(),
              double(mla_io.bytes_read) / step.latent_bytes(), t.packed_rows(), t.key_tile_rows,
              t.panels ? " in panels" : " (pairs, no panels)", plan.keys_per_split());
  std::printf("    mla bits == generic bits: %s", same_bits ? "yes" : "NO");
  if (error >= 0) std::printf("; max |O - O_double| %.2e (bf16 output rounding alone: <= 2^-8 of |O|)", error);
  std::printf("\n");
  if (!same_bits || error > 2e-2) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  if (argc > 1) threads = std::atoi(argv[1]);
  else if (const char* env = std::getenv("OMP_NUM_THREADS")) threads = std::atoi(env);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  const index_t heads = argc > 3 ? std::atoi(argv[3]) : 128;
  if (repeats < 1 || heads < 1 || threads < 0) {
    std::fprintf(stderr, "usage: %s [THREADS] [REPEATS >= 1] [HEADS]\n", argv[0]);
    return 2;
  }
  for (const index_t batch : {1, 2, 4})
    for (const index_t keys : {1024, 4096, 8192}) compare(batch, keys, heads, threads, repeats);
  return 0;
}
