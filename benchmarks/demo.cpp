// benchmarks/demo.cpp: the tileattn demo: one forward workload through tileattn and through
// standard attention on Eigen, timed, byte-counted and checked against the double reference;
// then tileattn again with Q, K, V and O in bf16 (its error includes the inputs' rounding),
// and tileattn's backward on the fp32 forward's O and LSE (timed and byte-counted).
//
//   tileattn_demo                                 # B=1 H=16 N=2048 d=128, non-causal
//   tileattn_demo --seqlen 1024 --head-dim 64 --causal --threads 2
//
// Accuracy rule (FlashAttention's test suite): tileattn's max error against the fp64
// reference must stay within 2x the max error of standard fp32 attention, plus 1e-5.
// The exit status is 1 when it does not, 2 on bad arguments.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "reference/naive_attention.hpp"
#include "standard_attention.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/tileattn.hpp"
#include "workload.hpp"

namespace {

using tileattn::index_t;
using tileattn::bench::AttentionShape;
using tileattn::bench::AttentionWorkload;

struct DemoOptions {
  AttentionShape shape;
  int threads = 0;         // 0: all hardware threads
  int repetitions = 3;     // timed calls per implementation; the best one is reported
  index_t check_heads = 2; // heads checked against the reference (first and last, ...)
};

void print_usage(const char* argv0) {
  std::printf(
      "usage: %s [--seqlen N] [--head-dim D] [--heads H] [--batch B] [--causal]\n"
      "          [--threads T] [--repetitions R] [--check-heads K]\n"
      "defaults: --seqlen 2048 --head-dim 128 --heads 16 --batch 1, non-causal, all threads,\n"
      "          3 repetitions, 2 heads checked against the fp64 reference\n",
      argv0);
}

bool parse_args(int argc, char** argv, DemoOptions& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](long min_value) -> long {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < min_value)
        throw std::invalid_argument(arg + " needs an integer >= " + std::to_string(min_value));
      return v;
    };
    if (arg == "--seqlen") opt.shape.seqlen_q = opt.shape.seqlen_k = value(1);
    else if (arg == "--head-dim") opt.shape.head_dim = value(1);
    else if (arg == "--heads") opt.shape.heads = value(1);
    else if (arg == "--batch") opt.shape.batch = value(1);
    else if (arg == "--causal") opt.shape.causal = true;
    else if (arg == "--threads") opt.threads = static_cast<int>(value(0));
    else if (arg == "--repetitions") opt.repetitions = static_cast<int>(value(1));
    else if (arg == "--check-heads") opt.check_heads = value(1);
    else if (arg == "--help" || arg == "-h") return false;
    else throw std::invalid_argument("unknown argument " + arg);
  }
  return true;
}

/// Best wall time in seconds of `repetitions` calls of f.
template <class F>
double best_seconds(int repetitions, F&& f) {
  double best = 1e300;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return best;
}

/// One head of a [batch, seqlen, heads, head_dim] view, copied so that the reference's
/// inner loops run over contiguous memory: row-major [seqlen, head_dim] for Q and K (dot
/// products along head_dim), column-major for V (the P V sums run along seqlen).
struct HeadCopy {
  std::vector<float> data;
  tileattn::TensorView<const float> view;

  HeadCopy(const tileattn::TensorView<const float>& t, index_t head, bool seqlen_contiguous) {
    const index_t batch = t.shape[0], seqlen = t.shape[1], d = t.shape[3];
    data.resize(static_cast<std::size_t>(batch * seqlen * d));
    const std::array<index_t, 4> stride =
        seqlen_contiguous ? std::array<index_t, 4>{seqlen * d, 1, 0, seqlen}
                          : std::array<index_t, 4>{seqlen * d, d, 0, 1};
    for (index_t b = 0; b < batch; ++b)
      for (index_t i = 0; i < seqlen; ++i)
        for (index_t x = 0; x < d; ++x)
          data[static_cast<std::size_t>(b * stride[0] + i * stride[1] + x * stride[3])] =
              t(b, i, head, x);
    view = {data.data(), {batch, seqlen, 1, d}, stride};
  }
};

/// The fp64 reference for one head of the workload.
tileattn::reference::AttentionResult reference_head(const AttentionWorkload& w, index_t head,
                                                    float scale) {
  const HeadCopy q(w.q_view(), head, false), k(w.k_view(), head, false), v(w.v_view(), head, true);
  return tileattn::reference::attention<float>(q.view, k.view, v.view, scale, w.shape.causal);
}

struct Errors {
  double o = 0.0, lse = 0.0;
};

/// Max |error| of o and lse on the checked heads, against the fp64 reference.
Errors max_errors(const AttentionWorkload& w, const std::vector<float>& o,
                  const std::vector<float>& lse, const std::vector<index_t>& heads_checked,
                  const std::vector<tileattn::reference::AttentionResult>& refs) {
  const AttentionShape& s = w.shape;
  Errors e;
  for (std::size_t c = 0; c < heads_checked.size(); ++c) {
    const index_t h = heads_checked[c];
    const auto& ref = refs[c];
    for (index_t b = 0; b < s.batch; ++b)
      for (index_t i = 0; i < s.seqlen_q; ++i) {
        for (index_t x = 0; x < s.head_dim; ++x) {
          const float got = o[static_cast<std::size_t>(((b * s.seqlen_q + i) * s.heads + h) * s.head_dim + x)];
          e.o = std::max(e.o, std::abs(static_cast<double>(got) - ref.out(b, i, 0, x)));
        }
        const double want = ref.log_sum_exp(b, 0, i);
        const float got = lse[static_cast<std::size_t>((b * s.heads + h) * s.seqlen_q + i)];
        if (std::isinf(want)) {
          if (!(std::isinf(got) && got < 0)) e.lse = INFINITY;
        } else {
          e.lse = std::max(e.lse, std::abs(static_cast<double>(got) - want));
        }
      }
  }
  return e;
}

}  // namespace

/// What the bf16 products run on in this process: AMX tiles (checked at run time), vdpbf16ps
/// bf16 pairs, or float tiles.
static const char* bf16_tiles() {
  if (tileattn::kernels::tile_operands_for<tileattn::bf16>() != tileattn::TileOperands::bf16_pairs) return "float";
  return std::string_view(tileattn::active_isa()).ends_with("+amx") ? "AMX pair" : "vdpbf16ps pair";
}

int main(int argc, char** argv) {
  DemoOptions opt;
  try {
    if (!parse_args(argc, argv, opt)) {
      print_usage(argv[0]);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tileattn_demo: %s\n", e.what());
    print_usage(argv[0]);
    return 2;
  }
  const AttentionShape& s = opt.shape;
  if (s.head_dim < 1 || s.head_dim > tileattn::max_head_dim) {
    std::fprintf(stderr, "tileattn_demo: head_dim %lld is not in [1, %lld]\n",
                 static_cast<long long>(s.head_dim), static_cast<long long>(tileattn::max_head_dim));
    return 2;
  }

  AttentionWorkload w(s);
  tileattn::ForwardOptions options;
  options.causal = s.causal;
  options.execution.num_threads = opt.threads;
  const tileattn::TilePlan plan = tileattn::plan_forward(w.q_view(), w.k_view(), w.v_view(), options).tiles();
  const int workers = tileattn::worker_count(options.execution);
  std::printf("tileattn %s demo: B=%lld H=%lld N=%lld d=%lld %s, fp32, %d thread%s (%s backend)\n",
              tileattn::version, static_cast<long long>(s.batch),
              static_cast<long long>(s.heads), static_cast<long long>(s.seqlen_q),
              static_cast<long long>(s.head_dim), s.causal ? "causal" : "non-causal", workers,
              workers == 1 ? "" : "s",
              tileattn::to_string(tileattn::resolve_backend(options.execution.backend)));
  std::printf("micro-kernels: %s; ", tileattn::active_isa());  // what runs on this CPU, not what was compiled
  std::printf("tile plan: Br=%lld query rows x Bc=%lld key rows, working set %zu KiB of a %zu KiB SRAM budget\n",
              static_cast<long long>(plan.query_tile_rows), static_cast<long long>(plan.key_tile_rows),
              plan.working_set_bytes / 1024, plan.sram_budget_bytes / 1024);

  // tileattn: one counted call (also the warm-up), then the timed ones.
  tileattn::IoCounts io;
  options.io_counts = &io;
  tileattn::forward(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), options);
  options.io_counts = nullptr;
  const double tiled_s = best_seconds(opt.repetitions, [&] {
    tileattn::forward(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), options);
  });
  const std::vector<float> tiled_o = w.o, tiled_lse = w.lse;

  // The same call in bf16 (inputs rounded to bf16; O stored in bf16, LSE in float).
  using tileattn::bf16;
  const auto to_bf16 = [](const std::vector<float>& x) {
    std::vector<bf16> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = bf16(x[i]);
    return out;
  };
  const std::vector<bf16> q16 = to_bf16(w.q), k16 = to_bf16(w.k), v16 = to_bf16(w.v);
  std::vector<bf16> o16(w.o.size());
  const auto bshd = [&](auto* data, index_t seqlen) {
    return tileattn::make_bshd(data, s.batch, seqlen, s.heads, s.head_dim);
  };
  auto run_bf16 = [&] {
    tileattn::forward(bshd(q16.data(), s.seqlen_q), bshd(k16.data(), s.seqlen_k), bshd(v16.data(), s.seqlen_k),
                      bshd(o16.data(), s.seqlen_q), w.lse_view(), options);
  };
  tileattn::IoCounts io16;
  options.io_counts = &io16;
  run_bf16();
  options.io_counts = nullptr;
  const double bf16_s = best_seconds(opt.repetitions, run_bf16);
  std::vector<float> bf16_o(o16.size());
  for (std::size_t i = 0; i < o16.size(); ++i) bf16_o[i] = tileattn::to_float(o16[i]);
  const std::vector<float> bf16_lse = w.lse;

  // The backward on the fp32 forward's O and LSE, with dO from N(0, 1): training's other half.
  std::vector<float> dout(w.o.size()), dq(w.q.size()), dk(w.k.size()), dv(w.v.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& x : dout) x = normal(rng);
  tileattn::BackwardOptions backward_options(options);
  const tileattn::SavedLseView saved_lse{tiled_lse.data(), {s.batch, s.heads, s.seqlen_q},
                                         {s.heads * s.seqlen_q, s.seqlen_q, 1}};
  auto run_backward = [&] {
    tileattn::backward(w.q_view(), w.k_view(), w.v_view(), bshd(tiled_o.data(), s.seqlen_q), saved_lse,
                       bshd(dout.data(), s.seqlen_q), bshd(dq.data(), s.seqlen_q), bshd(dk.data(), s.seqlen_k),
                       bshd(dv.data(), s.seqlen_k), backward_options);
  };
  tileattn::IoCounts io_backward;
  backward_options.io_counts = &io_backward;
  run_backward();
  backward_options.io_counts = nullptr;
  const double backward_s = best_seconds(opt.repetitions, run_backward);

  // Standard attention on Eigen: warm-up (sizes the workspaces), then the timed calls.
  tileattn::bench::StandardAttention standard(options.execution);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  auto run_standard = [&] {
    standard(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), scale, s.causal);
  };
  run_standard();
  const double standard_s = best_seconds(opt.repetitions, run_standard);

  // fp64 reference on a few heads (first, last, and evenly between): the full reference
  // is O(N^2 d) scalar double work per head.
  std::vector<index_t> heads_checked;
  const index_t k = std::min(opt.check_heads, s.heads);
  for (index_t c = 0; c < k; ++c) heads_checked.push_back(k == 1 ? 0 : c * (s.heads - 1) / (k - 1));
  std::vector<tileattn::reference::AttentionResult> refs(heads_checked.size());
  const auto ref_start = std::chrono::steady_clock::now();
  tileattn::parallel_for(options.execution, static_cast<index_t>(heads_checked.size()),
                         [&](index_t c, int) {
                           refs[static_cast<std::size_t>(c)] =
                               reference_head(w, heads_checked[static_cast<std::size_t>(c)], scale);
                         });
  const std::chrono::duration<double> ref_s = std::chrono::steady_clock::now() - ref_start;
  const Errors tiled_err = max_errors(w, tiled_o, tiled_lse, heads_checked, refs);
  const Errors standard_err = max_errors(w, w.o, w.lse, heads_checked, refs);
  const Errors bf16_err = max_errors(w, bf16_o, bf16_lse, heads_checked, refs);

  const double tiled_bytes = static_cast<double>(io.bytes_read + io.bytes_written);
  const double standard_bytes = static_cast<double>(
      tileattn::bench::standard_attention_hbm_bytes(s.batch, s.heads, s.seqlen_q, s.seqlen_k, s.head_dim));
  const double gflop = s.flops() * 1e-9;
  std::printf("\n%-22s %10s %9s %16s %13s %13s\n", "", "time (ms)", "GFLOP/s", "HBM bytes (MiB)",
              "max|err| O", "max|err| LSE");
  std::printf("%-22s %10.1f %9.1f %16.1f %13.2e %13.2e\n", "tileattn (tiled)", tiled_s * 1e3,
              gflop / tiled_s, tiled_bytes / (1 << 20), tiled_err.o, tiled_err.lse);
  std::printf("%-22s %10.1f %9.1f %16.1f %13.2e %13.2e\n", "standard (Eigen)", standard_s * 1e3,
              gflop / standard_s, standard_bytes / (1 << 20), standard_err.o, standard_err.lse);
  std::printf("%-22s %10.1f %9.1f %16.1f %13.2e %13.2e\n", "tileattn bf16", bf16_s * 1e3,
              gflop / bf16_s, static_cast<double>(io16.bytes_read + io16.bytes_written) / (1 << 20),
              bf16_err.o, bf16_err.lse);
  std::printf("%-22s %10.1f %9.1f %16.1f %13s %13s\n", "tileattn backward", backward_s * 1e3,
              2.5 * gflop / backward_s, static_cast<double>(io_backward.bytes_read + io_backward.bytes_written) / (1 << 20),
              "-", "-");
  std::printf("\nspeed: tileattn runs at %.2fx the standard attention's rate; it moves %.1fx fewer HBM bytes\n",
              standard_s / tiled_s, standard_bytes / tiled_bytes);
  std::printf("bytes: tileattn counted per tile load/store; standard from the FlashAttention Algorithm 0 formula\n");
  std::printf("FLOPs: 4*B*H*N^2*d%s = %.1f GFLOP per call; best of %d calls each\n",
              s.causal ? "/2" : "", gflop, opt.repetitions);
  std::printf("bf16: Q, K, V, O in bf16 (%s tiles), accumulation in fp32, %.2fx the fp32 rate; its error is\n"
              "      against the fp32 inputs' reference, so it includes rounding the inputs to bf16 (docs/precision.md)\n",
              bf16_tiles(), tiled_s / bf16_s);

  std::printf("backward: dQ, dK, dV from dO (fp32; docs/backward.md), credited 2.5x the forward's FLOPs: %.2fx the\n"
              "      forward's rate; its accuracy is tested in tests/kernels/backward_test.cpp\n",
              2.5 * tiled_s / backward_s);

  const double o_bound = 2.0 * standard_err.o + 1e-5, lse_bound = 2.0 * standard_err.lse + 1e-5;
  const bool ok = tiled_err.o <= o_bound && tiled_err.lse <= lse_bound;
  std::printf("accuracy: %zu head%s checked against the fp64 reference (%.1f s); bound 2 x standard + 1e-5 "
              "= %.2e (O), %.2e (LSE): %s\n",
              heads_checked.size(), heads_checked.size() == 1 ? "" : "s", ref_s.count(), o_bound,
              lse_bound, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
