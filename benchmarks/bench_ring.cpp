// benchmarks/bench_ring.cpp: ring attention over MPI (distributed/ring.hpp): where each
// ring step's time goes, and how much of the communication the compute hides.
//
//   mpirun -np 4 --bind-to none ./bench_ring [--seqlen 8192] [--heads 8] [--heads-kv 8]
//       [--head-dim 128] [--dtype fp32|bf16] [--causal 0|1] [--sharding zigzag|contiguous]
//       [--reps 5] [--backward 0|1] [--threads T] [--mpi-thread serialized|funneled]
//   (as root: mpirun --allow-run-as-root --oversubscribe ...; benchmarks/ring.sh runs a sweep)
//
// After one warm-up, for --reps repetitions, it times:
//   (a) ring::forward (and ring::backward with --backward 1) with RingStats: per ring step,
//       the compute seconds and the seconds blocked in MPI waits (communication not hidden);
//   (b) the communication alone: the same ring of exchanges (ring::detail::Exchange, the
//       byte count of a K/V block; for the backward, also the fp32 dK/dV accumulators that
//       travel with it, P exchanges) with no compute, timed per step;
//   (c) on rank 0 only, for reference, single-process tileattn::forward (and backward) on the
//       whole sequence with the same --threads as each rank (so the table compares P ranks
//       x T threads with 1 process x T threads; the other ranks sleep meanwhile).
// Every time is the slowest rank's (MPI_Reduce MAX): the slowest rank sets the ring's pace.
// Tables give the median over reps and [min-max]. Hidden = 1 - wait / comm-alone, clamped to
// [0, 1], per step. FLOPs count visible scores only: 2 (d + dv) per score per (batch, head),
// N^2 scores non-causal, N (N + 1) / 2 causal; the backward is credited 2.5x the forward.
// The compute spread (max / min over ranks of a rank's total compute) shows the balance of
// the sharding: about 1 for zig-zag; causal contiguous, rank P-1 sees 2P - 1 times rank 0's
// scores (measured less: rank 0's diagonal blocks cost more per visible score).
// Backward steps: a step's wait holds the dK/dV accumulator of the step before and the next
// K/V block, and the last step the final hop of the accumulators home, which nothing hides.
// Correctness is the test suite's; here every rank checks only that its outputs and LSE are
// finite (the program exits 1 otherwise).
#include <mpi.h>
#include <unistd.h>

#include <tileattn/distributed/ring.hpp>
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace ring = tileattn::ring;
using tileattn::index_t;

struct Args {
  index_t seqlen = 8192, heads = 8, heads_kv = 8, head_dim = 128;
  std::string dtype = "fp32", sharding = "zigzag";
  bool causal = true, backward = false;
  int reps = 5, threads = 0;  // 0: hardware threads / ranks (at least 1)
  std::string mpi_thread = "serialized";  // serialized: the ring's progress thread; funneled: none
};

[[noreturn]] void usage(int rank, const std::string& what) {
  if (rank == 0)
    std::fprintf(stderr,
                 "bench_ring: %s\nflags: --seqlen N --heads H --heads-kv Hkv --head-dim d --dtype fp32|bf16 "
                 "--causal 0|1 --sharding zigzag|contiguous --reps R --backward 0|1 --threads T --mpi-thread serialized|funneled\n",
                 what.c_str());
  MPI_Finalize();
  std::exit(2);
}

Args parse(int argc, char** argv, int rank) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(rank, "missing value after " + flag);
    const std::string value = argv[++i];
    try {
      if (flag == "--seqlen") a.seqlen = std::stol(value);
      else if (flag == "--heads") a.heads = std::stol(value);
      else if (flag == "--heads-kv") a.heads_kv = std::stol(value);
      else if (flag == "--head-dim") a.head_dim = std::stol(value);
      else if (flag == "--dtype") a.dtype = value;
      else if (flag == "--causal") a.causal = std::stoi(value) != 0;
      else if (flag == "--sharding") a.sharding = value;
      else if (flag == "--reps") a.reps = std::stoi(value);
      else if (flag == "--backward") a.backward = std::stoi(value) != 0;
      else if (flag == "--threads") a.threads = std::stoi(value);
      else if (flag == "--mpi-thread") a.mpi_thread = value;
      else usage(rank, "unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage(rank, "bad value '" + value + "' for " + flag);
    }
  }
  if (a.dtype != "fp32" && a.dtype != "bf16") usage(rank, "--dtype must be fp32 or bf16");
  if (a.sharding != "zigzag" && a.sharding != "contiguous") usage(rank, "--sharding must be zigzag or contiguous");
  if (a.reps < 1 || a.seqlen < 1 || a.heads < 1 || a.heads_kv < 1 || a.head_dim < 1 || a.heads % a.heads_kv != 0)
    usage(rank, "need reps, seqlen, heads, heads-kv, head-dim >= 1 and heads % heads-kv == 0");
  return a;
}

// ---- statistics over repetitions -------------------------------------------------------

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> x) {
  if (x.empty()) return {};
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return {n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]), x.front(), x.back()};
}
std::string fmt(const Summary& s, const char* f = "%.4f") {
  char m[64], lo[64], hi[64], out[256];
  std::snprintf(m, sizeof m, f, s.median);
  std::snprintf(lo, sizeof lo, f, s.min);
  std::snprintf(hi, sizeof hi, f, s.max);
  std::snprintf(out, sizeof out, "%s [%s-%s]", m, lo, hi);
  return out;
}
double clamp01(double x) { return std::isfinite(x) ? std::clamp(x, 0.0, 1.0) : 0.0; }

/// Rank 0 gets the element-wise max (or min) over ranks of `local`.
std::vector<double> reduce(const std::vector<double>& local, MPI_Op op) {
  std::vector<double> out(local.size());
  MPI_Reduce(local.data(), out.data(), static_cast<int>(local.size()), MPI_DOUBLE, op, 0, MPI_COMM_WORLD);
  return out;
}

/// Waits for every rank without spinning on a core (the ranks share the machine's cores
/// with rank 0's reference run).
void quiet_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(500);
  }
}

/// One phase (forward or backward) over the repetitions, on rank 0: per rep, the slowest
/// rank's per-step compute, wait and comm-alone seconds, its whole-call seconds, and the
/// largest and smallest total compute over ranks.
struct Phase {
  int steps = 0;
  std::vector<std::vector<double>> compute, wait, comm;  // [rep][step]
  std::vector<double> seconds, compute_max, compute_min, in_steps;  // in_steps: compute + waits
  std::vector<std::vector<double>> rank_compute;  // [rep][rank], total compute
  std::uint64_t bytes_sent = 0;

  void add(const ring::RingStats& st, const std::vector<double>& comm_steps, int rank, int size) {
    steps = size;
    std::vector<double> local;
    for (int s = 0; s < size; ++s) {
      local.push_back(s < static_cast<int>(st.step_compute_seconds.size()) ? st.step_compute_seconds[s] : st.compute_seconds);
      local.push_back(s < static_cast<int>(st.step_wait_seconds.size()) ? st.step_wait_seconds[s] : 0.0);
      local.push_back(s < static_cast<int>(comm_steps.size()) ? comm_steps[s] : 0.0);
    }
    local.push_back(st.seconds);
    local.push_back(st.compute_seconds);
    local.push_back(st.compute_seconds + st.wait_seconds);
    const std::vector<double> mx = reduce(local, MPI_MAX);
    const std::vector<double> mn = reduce({st.compute_seconds}, MPI_MIN);
    std::vector<double> all(static_cast<std::size_t>(size));
    MPI_Gather(&st.compute_seconds, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank != 0) return;
    std::vector<double> c, w, m;
    for (int s = 0; s < size; ++s) {
      c.push_back(mx[3 * s]);
      w.push_back(mx[3 * s + 1]);
      m.push_back(mx[3 * s + 2]);
    }
    compute.push_back(c), wait.push_back(w), comm.push_back(m);
    seconds.push_back(mx[3 * size]);
    compute_max.push_back(mx[3 * size + 1]);
    in_steps.push_back(mx[3 * size + 2]);
    compute_min.push_back(mn[0]);
    rank_compute.push_back(all);
    bytes_sent = st.bytes_sent;
  }
};

std::vector<double> column(const std::vector<std::vector<double>>& x, std::size_t i) {
  std::vector<double> out;
  for (const auto& row : x) out.push_back(row[i]);
  return out;
}

void print_phase(const char* name, const Phase& ph, double flops, const std::vector<double>& reference_seconds,
                 int threads) {
  const int P = ph.steps;
  std::printf("\n### %s: per ring step (slowest rank; median [min-max] over %zu reps)\n\n", name, ph.seconds.size());
  std::printf("| step | compute s | exposed wait s | comm alone s | hidden |\n|---:|---:|---:|---:|---:|\n");
  std::vector<double> total_c(ph.seconds.size()), total_w(ph.seconds.size()), total_m(ph.seconds.size());
  for (int s = 0; s < P; ++s) {
    const auto c = column(ph.compute, s), w = column(ph.wait, s), m = column(ph.comm, s);
    std::vector<double> hidden;
    for (std::size_t r = 0; r < c.size(); ++r) {
      total_c[r] += c[r], total_w[r] += w[r], total_m[r] += m[r];
      hidden.push_back(clamp01(1.0 - w[r] / m[r]));
    }
    const bool has_comm = summarize(m).max > 0;
    std::printf("| %d | %s | %s | %s | %s |\n", s, fmt(summarize(c)).c_str(), fmt(summarize(w)).c_str(),
                has_comm ? fmt(summarize(m)).c_str() : "-", has_comm ? fmt(summarize(hidden), "%.2f").c_str() : "-");
  }
  std::vector<double> hidden_total;
  for (std::size_t r = 0; r < total_c.size(); ++r) hidden_total.push_back(clamp01(1.0 - total_w[r] / total_m[r]));
  std::printf("| all | %s | %s | %s | %s |\n", fmt(summarize(total_c)).c_str(), fmt(summarize(total_w)).c_str(),
              P > 1 ? fmt(summarize(total_m)).c_str() : "-", P > 1 ? fmt(summarize(hidden_total), "%.2f").c_str() : "-");
  // A rank's wait also holds the time its neighbours' compute ran longer than its own
  // (imbalance, jitter), which no overlap hides. Beyond the slowest compute: the time the
  // slowest rank spent in the steps (compute + waits; not the set-up and the final copies)
  // minus the sum over steps of the slowest rank's compute; what of it communication would
  // explain is at most the communication alone.
  if (P > 1) {
    std::vector<double> beyond, hidden_beyond;
    for (std::size_t r = 0; r < total_c.size(); ++r) {
      beyond.push_back(std::max(0.0, ph.in_steps[r] - total_c[r]));
      hidden_beyond.push_back(clamp01(1.0 - beyond.back() / total_m[r]));
    }
    std::printf("\ntime beyond the slowest compute (time in the steps - sum of the steps' slowest compute): %s s; "
                "communication alone %s s; hidden by that measure: %s\n",
                fmt(summarize(beyond)).c_str(), fmt(summarize(total_m)).c_str(),
                fmt(summarize(hidden_beyond), "%.2f").c_str());
  }
  std::vector<double> gflops, spread, ref_gflops;
  for (double t : ph.seconds) gflops.push_back(flops / t * 1e-9);
  for (std::size_t r = 0; r < ph.seconds.size(); ++r) spread.push_back(ph.compute_max[r] / ph.compute_min[r]);
  for (double t : reference_seconds) ref_gflops.push_back(flops / t * 1e-9);
  const Summary ring_t = summarize(ph.seconds), ref_t = summarize(reference_seconds);
  std::printf("\n| %s | seconds | GFLOP/s |\n|---|---:|---:|\n", name);
  std::printf("| ring, %d ranks x %d threads (whole call, slowest rank) | %s | %s |\n", P, threads,
              fmt(ring_t).c_str(), fmt(summarize(gflops), "%.1f").c_str());
  std::printf("| one process x %d threads, whole sequence (rank 0) | %s | %s |\n", threads, fmt(ref_t).c_str(),
              fmt(summarize(ref_gflops), "%.1f").c_str());
  std::printf("\nspeed-up of the ring over one process (median times): %.2fx; %.3f GFLOP per call; %.1f MiB sent per rank\n",
              ref_t.median / ring_t.median, flops * 1e-9, static_cast<double>(ph.bytes_sent) / (1 << 20));
  std::printf("compute spread, max/min over ranks of total compute: %s; per rank (median s):",
              fmt(summarize(spread), "%.2f").c_str());
  for (int r = 0; r < P; ++r) std::printf(" r%d %.4f", r, summarize(column(ph.rank_compute, r)).median);
  std::printf("\n");
}

// ---- the benchmark ----------------------------------------------------------------------

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> x(n);
  for (T& e : x) e = tileattn::from_float<T>(normal(rng));
  return x;
}

template <class T>
bool all_finite(const std::vector<T>& x) {
  return std::all_of(x.begin(), x.end(), [](T e) { return std::isfinite(tileattn::to_float(e)); });
}

/// The ring's exchanges with no compute: forward, P - 1 exchanges of `kv_bytes`; backward,
/// also P exchanges of `grad_bytes` (the dK/dV accumulators), in flight together as the
/// backward has them. Seconds per step.
std::vector<double> comm_alone(const ring::detail::RingComm& rc, std::size_t kv_bytes, std::size_t grad_bytes,
                               bool backward) {
  std::vector<unsigned char> kv_a(kv_bytes), kv_b(kv_bytes), g_a(backward ? grad_bytes : 0), g_b(g_a.size());
  std::vector<double> steps;
  const int exchanges = backward ? rc.size : rc.size - 1;
  if (rc.size == 1) return steps;
  MPI_Barrier(rc.comm);
  for (int s = 0; s < exchanges; ++s) {
    const double t0 = MPI_Wtime();
    ring::detail::Exchange kv, grad;
    if (s + 1 < rc.size) kv.post(rc, s % 2 ? kv_b.data() : kv_a.data(), s % 2 ? kv_a.data() : kv_b.data(), kv_bytes, 5000 + s);
    if (backward) grad.post(rc, s % 2 ? g_b.data() : g_a.data(), s % 2 ? g_a.data() : g_b.data(), grad_bytes, 6000 + s);
    kv.wait();
    grad.wait();
    steps.push_back(MPI_Wtime() - t0);
  }
  return steps;
}

template <class T>
int run(const Args& a, int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const ring::detail::RingComm rc(MPI_COMM_WORLD);
  const int threads = a.threads > 0 ? a.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / size);
  const ring::ShardLayout layout(a.seqlen, size, a.sharding == "zigzag" ? ring::Sharding::zigzag : ring::Sharding::contiguous);
  const index_t B = 1, N = a.seqlen, H = a.heads, Hkv = a.heads_kv, d = a.head_dim, dv = a.head_dim;
  const index_t n = layout.local_len(rank);

  tileattn::BackwardOptions opt;  // also the forward's options (BackwardOptions is a ForwardOptions)
  opt.causal = a.causal;
  opt.execution = tileattn::Execution{tileattn::Backend::automatic, threads};

  // This rank's shard: random values (the timing does not depend on them).
  const unsigned seed = 1234u + 17u * static_cast<unsigned>(rank);
  auto q = random_values<T>(static_cast<std::size_t>(B * n * H * d), seed);
  auto k = random_values<T>(static_cast<std::size_t>(B * n * Hkv * d), seed + 1);
  auto v = random_values<T>(static_cast<std::size_t>(B * n * Hkv * dv), seed + 2);
  auto dout = random_values<T>(static_cast<std::size_t>(B * n * H * dv), seed + 3);
  std::vector<T> o(dout.size()), dq(q.size()), dk(k.size()), dvv(v.size());
  std::vector<float> lse(static_cast<std::size_t>(B * H * n));
  const auto view = [&](std::vector<T>& x, index_t heads, index_t dim) { return tileattn::make_bshd(x.data(), B, n, heads, dim); };
  const auto cview = [&](std::vector<T>& x, index_t heads, index_t dim) {
    return tileattn::TensorView<const T>(view(x, heads, dim));
  };
  const auto lse_view = tileattn::make_lse(lse.data(), B, H, n);

  const std::size_t kv_bytes = static_cast<std::size_t>(layout.max_local_len() * B * Hkv * (d + dv)) * sizeof(T);
  const std::size_t grad_bytes = static_cast<std::size_t>(layout.max_local_len() * B * Hkv * (d + dv)) * sizeof(float);

  Phase fwd, bwd;
  for (int rep = -1; rep < a.reps; ++rep) {  // rep -1: the warm-up
    ring::RingStats fs, bs;
    MPI_Barrier(MPI_COMM_WORLD);
    ring::forward(MPI_COMM_WORLD, layout, cview(q, H, d), cview(k, Hkv, d), cview(v, Hkv, dv), view(o, H, dv),
                       lse_view, &fs, opt);
    if (a.backward) {
      MPI_Barrier(MPI_COMM_WORLD);
      ring::backward(MPI_COMM_WORLD, layout, cview(q, H, d), cview(k, Hkv, d), cview(v, Hkv, dv),
                          cview(o, H, dv), tileattn::SavedLseView(lse_view), cview(dout, H, dv), view(dq, H, d),
                          view(dk, Hkv, d), view(dvv, Hkv, dv), &bs, opt);
    }
    const auto fwd_comm = comm_alone(rc, kv_bytes, grad_bytes, false);
    const auto bwd_comm = a.backward ? comm_alone(rc, kv_bytes, grad_bytes, true) : std::vector<double>{};
    if (rep < 0) continue;
    fwd.add(fs, fwd_comm, rank, size);
    if (a.backward) bwd.add(bs, bwd_comm, rank, size);
  }

  // The cheap sanity check: finite outputs and LSE on every rank.
  int ok = all_finite(o) && all_finite(lse) && (!a.backward || (all_finite(dq) && all_finite(dk) && all_finite(dvv)));
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  // The reference: one process, the whole sequence, the same threads, on rank 0 alone.
  std::vector<double> ref_fwd, ref_bwd;
  if (rank == 0) {
    auto fq = random_values<T>(static_cast<std::size_t>(B * N * H * d), 99);
    auto fk = random_values<T>(static_cast<std::size_t>(B * N * Hkv * d), 100);
    auto fv = random_values<T>(static_cast<std::size_t>(B * N * Hkv * dv), 101);
    auto fdo = random_values<T>(static_cast<std::size_t>(B * N * H * dv), 102);
    std::vector<T> fo(fdo.size()), fdq(fq.size()), fdk(fk.size()), fdv(fv.size());
    std::vector<float> flse(static_cast<std::size_t>(B * H * N));
    const auto fview = [&](std::vector<T>& x, index_t heads, index_t dim) { return tileattn::make_bshd(x.data(), B, N, heads, dim); };
    const auto fc = [&](std::vector<T>& x, index_t heads, index_t dim) { return tileattn::TensorView<const T>(fview(x, heads, dim)); };
    const auto flv = tileattn::make_lse(flse.data(), B, H, N);
    for (int rep = -1; rep < a.reps; ++rep) {
      double t0 = MPI_Wtime();
      tileattn::forward(fc(fq, H, d), fc(fk, Hkv, d), fc(fv, Hkv, dv), fview(fo, H, dv), flv, opt);
      if (rep >= 0) ref_fwd.push_back(MPI_Wtime() - t0);
      if (!a.backward) continue;
      t0 = MPI_Wtime();
      tileattn::backward(fc(fq, H, d), fc(fk, Hkv, d), fc(fv, Hkv, dv), fc(fo, H, dv), tileattn::SavedLseView(flv),
                         fc(fdo, H, dv), fview(fdq, H, d), fview(fdk, Hkv, d), fview(fdv, Hkv, dv), opt);
      if (rep >= 0) ref_bwd.push_back(MPI_Wtime() - t0);
    }
  }
  quiet_barrier();

  if (rank == 0) {
    const double visible = a.causal ? 0.5 * static_cast<double>(N) * static_cast<double>(N + 1)
                                    : static_cast<double>(N) * static_cast<double>(N);
    const double fwd_flops = 2.0 * static_cast<double>(d + dv) * static_cast<double>(B * H) * visible;
    std::printf("## bench_ring: %d ranks x %d threads, N %ld, H %ld/%ld, d %ld, %s, %s, %s%s\n\n", size, threads,
                static_cast<long>(N), static_cast<long>(H), static_cast<long>(Hkv), static_cast<long>(d),
                a.dtype.c_str(), a.causal ? "causal" : "non-causal", a.sharding.c_str(),
                a.backward ? ", forward + backward" : ", forward");
    std::printf("command: mpirun -np %d", size);
    for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
    std::printf("\nshard rows per rank: %ld (largest %ld); K/V block in transit %.2f MiB",
                static_cast<long>(layout.local_len(0)), static_cast<long>(layout.max_local_len()),
                static_cast<double>(kv_bytes) / (1 << 20));
    if (a.backward) std::printf(", dK/dV accumulators %.2f MiB", static_cast<double>(grad_bytes) / (1 << 20));
    std::printf("\nhardware threads: %u; ranks x threads = %d%s\n", std::thread::hardware_concurrency(), size * threads,
                size * threads > static_cast<int>(std::thread::hardware_concurrency())
                    ? " (oversubscribed: ranks time-share cores, waits include scheduling)"
                    : "");
    print_phase("forward", fwd, fwd_flops, ref_fwd, threads);
    if (a.backward) print_phase("backward", bwd, 2.5 * fwd_flops, ref_bwd, threads);
    std::printf("\nsanity: outputs%s and LSE finite on every rank: %s\n", a.backward ? ", dQ, dK, dV" : "",
                all_ok ? "yes" : "NO");
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The thread level is chosen before MPI_Init: serialized lets the ring run its progress
  // thread during compute; funneled leaves the transfers to MPI calls between kernels.
  bool funneled = false;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--mpi-thread" && std::string(argv[i + 1]) == "funneled") funneled = true;
  const int wanted = funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_SERIALIZED;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, wanted, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (provided < wanted) usage(rank, "the MPI library does not provide the thread level asked for");
  if (rank == 0)
    std::printf("MPI thread level: %s (progress thread during compute: %s)\n", funneled ? "funneled" : "serialized",
                ring::detail::BackgroundProgress::allowed() ? "yes" : "no, between kernels");
  const Args a = parse(argc, argv, rank);
  int code = 0;
  try {
    code = a.dtype == "fp32" ? run<float>(a, argc, argv) : run<tileattn::bf16>(a, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ring, rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
