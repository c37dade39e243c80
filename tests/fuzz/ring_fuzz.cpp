// tests/fuzz/ring_fuzz.cpp: libFuzzer harness for ring attention over MPI,
// tileattn::ring::forward and ring::backward (tileattn/distributed/ring.hpp).
//
// MPI: launched as `mpirun -n 4 --oversubscribe ring_fuzz <libFuzzer flags> CORPUS...`
// (one process without mpirun is a world of one rank). Rank 0 runs libFuzzer's driver (so
// it fuzzes, mutates, minimizes and writes crash files as any harness); the other ranks
// never reach it: LLVMFuzzerInitialize sends them into a loop that receives every input
// rank 0 runs (MPI_Bcast of its size and bytes) and runs it too, until rank 0 exits
// (an atexit handler broadcasts the stop). So every rank decodes the same bytes, whatever
// libFuzzer's mutations, and an input that fails is libFuzzer's on rank 0: after each input
// the ranks agree on a verdict (MPI_Allreduce) and rank 0 aborts if any rank's check
// failed (that rank prints why first). A sanitizer report on another rank ends the job
// through mpirun; BLOCKED ranks (a hang) end at libFuzzer's -timeout on rank 0.
//
// The input's bytes choose the ranks (1 to 4, at most the world's: MPI_Comm_split of the
// world into a sub-communicator of the first P ranks; the others idle for that input), the
// sharding (contiguous or zig-zag), the sequence (1 to 48 tokens: fewer than 2P leaves
// ranks without rows), batch 1 to 2, heads (1 or 2 K/V heads, GQA groups 1 to 3), head_dim 1
// to 40 and head_dim_v apart, the storage type (float or bf16), every option ring attention
// takes (causal, windows as window_side draws them, up to INT64_MAX; softcap 0, 5, 30;
// a softmax scale or the default; ALiBi slopes per head; sinks, some -inf), execution
// (backend, 0 to 2 threads), whether ring::backward follows the forward (with dsinks where
// there are sinks), Q scaled by 256 one time in eight (exact: a power of two; scores in the
// hundreds, LSEs past exact_row_stats_lse, where the backward must take P from the row
// statistics over every rank's keys, not from the float LSE), and one bad argument or none (layout of another rank count or seqlen
// 0, bias, mask, diagonal_offset, attention_chunk, softcap inf, num_threads, a sink count,
// Q one row short on the last rank, softmax_scale -1 on the last rank only, causal,
// heads_kv or window_left differing on the last rank), applied to the forward, or to the
// backward when there is one.
//
// Checks: a bad argument must make the call throw tileattn::invalid_argument on every rank
// of the ring, each naming the same parameter, the one expected, with every output (O,
// LSE, dQ, dK, dV, dsinks) bitwise its sentinel on every rank; a valid call must succeed on
// every rank. Each rank's shard of O, LSE, dQ, dK, dV (and dsinks, summed over the ring)
// is held to the double-precision reference of the whole unsharded sequence
// (tests/reference, the inputs N(0, 1), Q maybe x 256) under FlashAttention's rule, against
// a naive attention in the same precision on the same (rounded) inputs: O and LSE 2x,
// gradients 3x the naive error (bf16: at least one rounding of the gradient, 2^-8 of its
// magnitude, as backward_fuzz and the suites count it), plus 1e-4 x max(1, max|reference|) (the forward's 1e-4 with
// forward_fuzz's margin for wider options: the ring merges P partial states and sums P
// partial gradients where one process runs one online softmax, and a bf16 ring rounds every
// partial O to bf16 before its fp32 merge; tests/distributed/ring_test.cpp
// holds its float configurations to 2e-5); on dQ, dK and dsinks plus backward_fuzz's floor
// for terms that cancel (8 u' F, support/backward_support.hpp); bf16 on O, or 1e-4 + 2^-7 max|V| where that is larger (each pair rounds P and its
// partial O to bf16, the merge in fp32, O rounded once more: 2^-8 + 2^-9 + 2^-9 of max|V|;
// with few keys a naive bf16 attention's error can be far smaller than that); on dsinks
// 2^-7 x max(1, max|reference|) more (the ring's D_i = dO_i . O_i reads the bf16 O). Non-finite entries must sit where the reference has them. Anything else aborts.
//
// -DRING_FUZZ_BREAK scales the ring's O by 1.001 on the ring's rank 0 before the checks (a
// planted error: the harness must abort on its seed corpus).
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON -DTILEATTN_WITH_MPI=ON
//   cmake --build build-fuzz --target ring_fuzz
//   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 \
//     mpirun -n 4 --oversubscribe build-fuzz/tests/fuzz/ring_fuzz tests/fuzz/corpus/ring -max_len=256 -max_total_time=3600
// libFuzzer's -merge=1, -jobs and -fork start child processes of the driver, which must not
// join the MPI job: run those without mpirun (a world of one rank, where every input runs on
// one rank; the seed corpus was minimized so). An input keeps the rank count its bytes ask
// for, and mpirun gives it back.
// RING_FUZZ_VERBOSE=1 prints (on rank 0) what each input decodes to and how the call ended.
// (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "support/backward_support.hpp"
#include "support/naive_same_precision.hpp"
#include "support/shard_rows.hpp"
#include "support/test_support.hpp"
#include "tileattn/distributed/ring.hpp"

namespace {

using namespace tileattn;
using ring::ShardLayout;
using ring::Sharding;
using test::BackwardProblem;
using test::GradError;
using test::ProblemShape;
using test::sentinel;
using test::shard_lse_rows;
using test::shard_rows;
using test::shard_value;

int world_rank = 0, world_size = 1;
bool verbose = false;

/// A check that failed on this rank (printed at once; the verdict is collective).
struct Failure {
  bool failed = false;
  void operator()(const std::string& what) {
    if (!failed) std::fprintf(stderr, "ring_fuzz: rank %d: %s\n", world_rank, what.c_str());
    failed = true;
  }
};

// ---- What the input asks for --------------------------------------------------------------

enum class Bad {
  none, layout_ranks, layout_empty, bias, mask, diagonal_offset, attention_chunk, softcap, num_threads, sinks,
  q_short, scale_on_last, causal_differs, heads_kv_differs, window_differs, count
};
constexpr const char* bad_names[] = {"none", "layout ranks + 1", "layout seqlen 0", "bias", "mask", "diagonal_offset",
                                     "attention_chunk", "softcap inf", "num_threads", "sinks count", "q short on last",
                                     "softmax_scale -1 on last", "causal differs on last", "heads_kv differs on last",
                                     "window_left differs on last"};
/// The parameter each bad argument must be named by.
constexpr const char* bad_parameter[] = {"", "layout", "layout", "bias", "mask", "diagonal_offset",
                                         "attention_chunk", "softcap", "num_threads", "sinks", "q",
                                         "softmax_scale", "causal", "heads_kv", "window_left"};

struct Input {
  std::uint32_t seed = 0;
  int ranks = 1;
  Sharding sharding = Sharding::zigzag;
  ProblemShape shape{};
  bool bf16 = false, backward = false;
  BackwardOptions opts;
  std::vector<float> slopes, sinks;
  Bad bad = Bad::none;
  bool large_scores = false;  // Q x 256
};

Input decode(FuzzedDataProvider& in) {
  Input x;
  x.seed = in.ConsumeIntegral<std::uint32_t>();
  x.ranks = std::min(in.ConsumeIntegralInRange(1, 4), world_size);
  x.sharding = in.ConsumeBool() ? Sharding::contiguous : Sharding::zigzag;
  ProblemShape& s = x.shape;
  s.seqlen_q = s.seqlen_k = in.ConsumeIntegralInRange(1, 48);
  s.batch = in.ConsumeIntegralInRange(1, 2);
  s.heads_kv = in.ConsumeIntegralInRange(1, 2);
  s.heads = s.heads_kv * in.ConsumeIntegralInRange(1, 3);
  s.head_dim = in.ConsumeIntegralInRange(1, 40);
  s.head_dim_v = in.ConsumeBool() ? s.head_dim : in.ConsumeIntegralInRange(1, 24);
  x.bf16 = in.ConsumeIntegralInRange(0, 3) == 0;
  x.backward = in.ConsumeBool();
  ForwardOptions& o = x.opts;
  o.causal = in.ConsumeBool();
  o.window_left = fuzz::window_side(in);
  o.window_right = fuzz::window_side(in);
  const float caps[] = {0.0f, 0.0f, 5.0f, 30.0f};
  o.softcap = caps[in.ConsumeIntegralInRange(0, 3)];
  if (in.ConsumeBool()) o.softmax_scale = in.ConsumeFloatingPointInRange(0.01f, 1.0f);
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    x.slopes.resize(static_cast<std::size_t>(s.heads));
    for (float& v : x.slopes) v = in.ConsumeFloatingPointInRange(0.0f, 1.0f);
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    x.sinks.resize(static_cast<std::size_t>(s.heads));
    for (float& v : x.sinks) v = in.ConsumeIntegralInRange(0, 4) == 0 ? -fuzz::inf : in.ConsumeFloatingPointInRange(-3.0f, 3.0f);
  }
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[in.ConsumeIntegralInRange(0, 3)];
  if (!backend_available(backend)) backend = Backend::serial;
  o.execution = {backend, in.ConsumeIntegralInRange(0, 2)};
  const int bad = in.ConsumeIntegralInRange(0, 2 * static_cast<int>(Bad::count));  // none about half the time
  x.bad = bad < static_cast<int>(Bad::count) ? static_cast<Bad>(bad) : Bad::none;
  x.large_scores = in.ConsumeIntegralInRange(0, 7) == 7;
  return x;
}

std::string describe(const Input& x) {
  const ProblemShape& s = x.shape;
  const ForwardOptions& o = x.opts;
  return std::string(x.bf16 ? "bf16" : "float") + " ranks " + std::to_string(x.ranks) +
         (x.sharding == Sharding::zigzag ? " zig-zag" : " contiguous") + " N " + std::to_string(s.seqlen_q) + " B " +
         std::to_string(s.batch) + " H " + std::to_string(s.heads) + "/" + std::to_string(s.heads_kv) + " d " +
         std::to_string(s.head_dim) + " dv " + std::to_string(s.head_dim_v) + " causal " + std::to_string(o.causal) +
         " window " + std::to_string(o.window_left) + "," + std::to_string(o.window_right) + " softcap " +
         std::to_string(o.softcap) + " scale " + (o.softmax_scale ? std::to_string(*o.softmax_scale) : "default") +
         " alibi " + std::to_string(x.slopes.size()) + " sinks " + std::to_string(x.sinks.size()) + " " +
         to_string(o.execution.backend) + " x " + std::to_string(o.execution.num_threads) +
         (x.backward ? " forward+backward" : " forward") + (x.large_scores ? " Q x 256" : "") + " bad: " +
         bad_names[static_cast<int>(x.bad)];
}

// ---- A rank's shard ----------------------------------------------------------------------------

/// This rank's shard of the full problem, the ring's outputs on it (sentinels until
/// written), and the rows of full-sequence tensors that belong to it.
template <class T>
struct Shard {
  ProblemShape s;
  ShardLayout layout;
  int rank;
  index_t n;
  std::vector<T> q, k, v, dout, o, dq, dk, dv;
  std::vector<float> lse, dsinks;

  Shard(const BackwardProblem<T>& full, const ShardLayout& l, int r) : s(full.s), layout(l), rank(r) {
    n = layout.local_len(rank);
    cut(full.qv, q, s.heads, s.head_dim);
    cut(full.kv, k, s.heads_kv, s.head_dim);
    cut(full.vv, v, s.heads_kv, s.head_dim_v);
    cut(full.dov, dout, s.heads, s.head_dim_v);
    const T st = from_float<T>(sentinel);
    o.assign(static_cast<std::size_t>(s.batch * n * s.heads * s.head_dim_v), st);
    dq.assign(static_cast<std::size_t>(s.batch * n * s.heads * s.head_dim), st);
    dk.assign(static_cast<std::size_t>(s.batch * n * s.heads_kv * s.head_dim), st);
    dv.assign(static_cast<std::size_t>(s.batch * n * s.heads_kv * s.head_dim_v), st);
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * n), sentinel);
    dsinks.assign(static_cast<std::size_t>(s.heads), sentinel);
  }
  TensorView<T> view(std::vector<T>& x, index_t heads, index_t dim) { return make_bshd(x.data(), s.batch, n, heads, dim); }
  LseView lse_view() { return make_lse(lse.data(), s.batch, s.heads, n); }

  bool untouched() const {
    const T st = from_float<T>(sentinel);
    return fuzz::all_bits_equal(o, st) && fuzz::all_bits_equal(dq, st) && fuzz::all_bits_equal(dk, st) &&
           fuzz::all_bits_equal(dv, st) && fuzz::all_bits_equal(lse, sentinel) && fuzz::all_bits_equal(dsinks, sentinel);
  }

  /// This rank's rows of a full [B, N, heads, dim] tensor (any element type), as doubles.
  template <class E>
  std::vector<double> rows_of(const std::vector<E>& full, index_t heads, index_t dim) const {
    return shard_rows(full, layout, rank, s.batch, s.seqlen_q, heads, dim);
  }
  /// The same for a full [B, H, N] LSE.
  template <class E>
  std::vector<double> lse_rows_of(const std::vector<E>& full) const {
    return shard_lse_rows(full, layout, rank, s.batch * s.heads, s.seqlen_q);
  }
  template <class E>
  static std::vector<float> floats(const std::vector<E>& x) {
    std::vector<float> out;
    out.reserve(x.size());
    for (const E& e : x) out.push_back(static_cast<float>(shard_value(e)));
    return out;
  }

 private:
  void cut(const TensorView<T>& full, std::vector<T>& local, index_t heads, index_t dim) {
    local.resize(static_cast<std::size_t>(s.batch * n * heads * dim));
    ring::shard(full, make_bshd(local.data(), s.batch, n, heads, dim), layout, rank);
  }
};

// ---- The call, with its bad argument ------------------------------------------------------

/// Whether the bad argument `x.bad` is one on this input (some are not: a sink count of one
/// with one head, a row short on a rank without rows, a disagreement with one rank).
bool really_bad(const Input& x, index_t last_rows) {
  switch (x.bad) {
    case Bad::none: return false;
    case Bad::sinks: return x.shape.heads != 1;
    case Bad::q_short: return last_rows > 0;
    case Bad::causal_differs: case Bad::window_differs: return x.ranks > 1;
    case Bad::heads_kv_differs: return x.ranks > 1 && x.shape.heads_kv != 1;
    default: return true;
  }
}

/// Runs the forward (and the backward) of `x` on this rank's shard, the bad argument (where
/// `bad`: really_bad) applied to the last call. Returns the parameter named by an invalid_argument ("" if none).
template <class T>
std::string run_ring(MPI_Comm comm, const Input& x, Shard<T>& m, bool on_last, bool bad, Failure& failure) {
  const ProblemShape& s = x.shape;
  const int P = x.ranks;
  BackwardOptions opts = x.opts;
  opts.alibi_slopes = x.slopes;
  opts.sinks = x.sinks;
  const bool forward_is_bad = !x.backward;
  const auto forward = [&](BackwardOptions o, const ShardLayout& layout, index_t q_rows, index_t kv_heads) {
    TensorView<T> qv = m.view(m.q, s.heads, s.head_dim), kv = m.view(m.k, s.heads_kv, s.head_dim),
                  vv = m.view(m.v, s.heads_kv, s.head_dim_v);
    qv.shape[1] = q_rows;
    kv.shape[2] = vv.shape[2] = kv_heads;
    ring::forward(comm, layout, TensorView<const T>(qv), TensorView<const T>(kv), TensorView<const T>(vv),
                  m.view(m.o, s.heads, s.head_dim_v), m.lse_view(), static_cast<const ForwardOptions&>(o));
  };
  const auto backward = [&](BackwardOptions o, const ShardLayout& layout, index_t q_rows, index_t kv_heads) {
    TensorView<T> qv = m.view(m.q, s.heads, s.head_dim), kv = m.view(m.k, s.heads_kv, s.head_dim),
                  vv = m.view(m.v, s.heads_kv, s.head_dim_v), dkv = m.view(m.dk, s.heads_kv, s.head_dim),
                  dvv = m.view(m.dv, s.heads_kv, s.head_dim_v);
    qv.shape[1] = q_rows;
    kv.shape[2] = vv.shape[2] = dkv.shape[2] = dvv.shape[2] = kv_heads;
    if (!x.sinks.empty() && o.dsinks.empty()) o.dsinks = m.dsinks;
    ring::backward(comm, layout, TensorView<const T>(qv), TensorView<const T>(kv), TensorView<const T>(vv),
                   TensorView<const T>(m.view(m.o, s.heads, s.head_dim_v)), m.lse_view(),
                   TensorView<const T>(m.view(m.dout, s.heads, s.head_dim_v)), m.view(m.dq, s.heads, s.head_dim), dkv,
                   dvv, o);
  };
  if (x.backward) forward(opts, m.layout, m.n, s.heads_kv);  // valid: the backward is the bad call
  // The bad argument, on the last call.
  ShardLayout layout = m.layout;
  index_t q_rows = m.n, kv_heads = s.heads_kv;
  std::vector<float> bias(static_cast<std::size_t>(s.seqlen_q * s.seqlen_k), 0.0f), one_sink(1, 0.0f);
  std::unique_ptr<bool[]> mask(new bool[static_cast<std::size_t>(s.seqlen_q * s.seqlen_k)]());
  switch (bad ? x.bad : Bad::none) {
    case Bad::none: break;
    case Bad::layout_ranks: layout = ShardLayout(s.seqlen_q, P + 1, x.sharding); break;
    case Bad::layout_empty: layout = ShardLayout(0, P, x.sharding); break;
    case Bad::bias: opts.bias = {bias.data(), {1, 1, s.seqlen_q, s.seqlen_k}, {0, 0, s.seqlen_k, 1}}; break;
    case Bad::mask: opts.mask = {mask.get(), {1, 1, s.seqlen_q, s.seqlen_k}, {0, 0, s.seqlen_k, 1}}; break;
    case Bad::diagonal_offset: opts.diagonal_offset = 0; break;
    case Bad::attention_chunk: opts.attention_chunk = 8; break;
    case Bad::softcap: opts.softcap = fuzz::inf; break;
    case Bad::num_threads: opts.execution.num_threads = 100000; break;
    case Bad::sinks: opts.sinks = one_sink, opts.dsinks = {}; break;  // wrong count unless one head
    case Bad::q_short: if (on_last) q_rows -= 1; break;
    case Bad::scale_on_last: if (on_last) opts.softmax_scale = -1.0f; break;
    case Bad::causal_differs: if (on_last) opts.causal = !opts.causal; break;
    case Bad::heads_kv_differs: if (on_last) kv_heads = 1; break;
    case Bad::window_differs: if (on_last) opts.window_left = opts.window_left == 3 ? 4 : 3; break;
    default: break;
  }
  try {
    if (forward_is_bad) forward(opts, layout, q_rows, kv_heads);
    else backward(opts, layout, q_rows, kv_heads);
  } catch (const tileattn::invalid_argument& err) {
    if (err.parameter().empty() || std::string(err.what()).find(err.parameter()) == std::string::npos)
      failure(std::string("an error that does not name its parameter: ") + err.what() + "\n  " + describe(x));
    if (verbose && world_rank == 0) std::fprintf(stderr, "ring_fuzz: threw %s\n", err.what());
    return err.parameter().empty() ? "?" : err.parameter();
  }
  return "";
}

// ---- The checks -----------------------------------------------------------------------------

template <class T>
void check_results(const Input& x, const BackwardProblem<T>& full, Shard<T>& m, Failure& failure) {
  const ProblemShape& s = x.shape;
  BackwardOptions opts = x.opts;
  opts.alibi_slopes = x.slopes;
  opts.sinks = x.sinks;
  const reference::Options ref_opt = reference::Options::from(opts);
  // The reference on the values the call saw (bf16: rounded), as floats.
  std::vector<float> qf = Shard<T>::floats(full.q), kf = Shard<T>::floats(full.k), vf = Shard<T>::floats(full.v);
  const auto as_float_view = [](std::vector<float>& f, const std::vector<T>& buffer, const TensorView<T>& v) {
    return TensorView<const float>{f.data() + (v.data - buffer.data()), v.shape, v.stride};
  };
  const TensorView<const float> qv = as_float_view(qf, full.q, full.qv), kv = as_float_view(kf, full.k, full.kv),
                                vv = as_float_view(vf, full.v, full.vv);
  const auto ref = reference::attention<float>(qv, kv, vv, ref_opt);
  constexpr bool is_float = std::is_same_v<T, float>;
  struct Out {
    const char* name;
    std::vector<float> got;
    std::vector<double> want, naive;
    double factor;                // the naive error's multiple
    std::vector<double> terms{};  // dQ, dK, dsinks: the cancelling terms' magnitudes (the floor)
  };
  std::vector<Out> outs;
  std::vector<float> naive_o(static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads * s.head_dim_v)),
      naive_lse(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q));
  test::naive_same_precision<T>(qv, kv, vv, ref_opt, make_bshd(naive_o.data(), s.batch, s.seqlen_q, s.heads, s.head_dim_v),
                                make_lse(naive_lse.data(), s.batch, s.heads, s.seqlen_q));
  double max_v = 0.0;  // over the whole sequence's V (finite: N(0, 1))
  for (float x : vf) max_v = std::max(max_v, static_cast<double>(std::abs(x)));
  std::vector<float> o_got = Shard<T>::floats(m.o);
#ifdef RING_FUZZ_BREAK
  if (m.rank == 0)
    for (float& v : o_got) v *= 1.001f;
#endif
  outs.push_back({"o", o_got, m.rows_of(ref.o, s.heads, s.head_dim_v),
                  m.rows_of(naive_o, s.heads, s.head_dim_v), 2.0});
  outs.push_back({"lse", m.lse, m.lse_rows_of(ref.lse), m.lse_rows_of(naive_lse), 2.0});
  std::vector<double> ref_dsinks, naive_dsinks;
  if (x.backward) {
    const reference::BackwardResult g = full.reference(ref_opt);
    const reference::NaiveBackwardF naive = full.naive(ref_opt);
    const double scale = opts.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(s.head_dim)));
    const test::CancellingTerms terms = test::cancelling_terms(full, ref_opt, scale);
    const auto naive_rows = [&](const std::vector<float>& v, index_t heads, index_t dim) {
      return m.rows_of(v, heads, dim);
    };
    outs.push_back({"dq", Shard<T>::floats(m.dq), m.rows_of(g.dq, s.heads, s.head_dim),
                    naive_rows(naive.dq, s.heads, s.head_dim), 3.0, m.rows_of(terms.dq, s.heads, s.head_dim)});
    outs.push_back({"dk", Shard<T>::floats(m.dk), m.rows_of(g.dk, s.heads_kv, s.head_dim),
                    naive_rows(naive.dk, s.heads_kv, s.head_dim), 3.0, m.rows_of(terms.dk, s.heads_kv, s.head_dim)});
    outs.push_back({"dv", Shard<T>::floats(m.dv), m.rows_of(g.dv, s.heads_kv, s.head_dim_v),
                    naive_rows(naive.dv, s.heads_kv, s.head_dim_v), 3.0});
    if (!x.sinks.empty())
      outs.push_back({"dsinks", m.dsinks, std::vector<double>(g.dsinks.begin(), g.dsinks.end()),
                      std::vector<double>(naive.dsinks.begin(), naive.dsinks.end()), 3.0, terms.dsinks});
  } else if (!fuzz::all_bits_equal(m.dq, from_float<T>(sentinel)) || !fuzz::all_bits_equal(m.dsinks, sentinel)) {
    failure("the forward wrote gradients\n  " + describe(x));
  }
  for (const Out& out : outs) {
    const GradError e = test::grad_error(out.got, out.want, out.name);
    if (!e.problem.empty()) {
      failure("differs from the reference: " + e.problem + "\n  " + describe(x));
      continue;
    }
    // FlashAttention's rule for every type: the naive same-precision error times the
    // output's factor, plus 1e-4 x max(1, max|reference|).
    const GradError n = test::grad_error(std::vector<float>(out.naive.begin(), out.naive.end()), out.want, "naive");
    // bf16 gradients as backward_fuzz and the suites hold them: a naive error below one
    // rounding of the gradient (2^-8 of its magnitude) is luck, and counts as one.
    const bool gradient = out.factor == 3.0;
    const double naive_error = !is_float && gradient ? std::max(n.max_error, 0x1p-8 * e.magnitude) : n.max_error;
    double bound = 1e-4 * std::max(e.magnitude, 1.0) + out.factor * naive_error;
    if (!is_float) {
      // O: or the rounding the ring adds, whichever is larger: each pair rounds P (2^-8 of
      // max|V|) and its partial O (2^-9) to bf16, the merge weights sum to 1, and O is
      // rounded once more (2^-9): 2^-7 max|V|.
      if (std::string(out.name) == "o") bound = std::max(bound, 1e-4 + 0x1p-7 * max_v);
      // dsinks: -sum_i P_sink,i D_i with D_i = dO_i . O_i read from the bf16 O (2^-8 of each
      // term, where the naive reads its own O): 2^-7 max(1, max|reference|) more.
      if (std::string(out.name) == "dsinks") bound += 0x1p-7 * std::max(e.magnitude, 1.0);
    }
    // dQ, dK, dsinks: plus backward_fuzz's floor where P (dP - D) cancels, 8 u' F with F the
    // terms' magnitudes (support/backward_support.hpp, cancelling_terms) and u' = 2^-24, or
    // 2^-8 for bf16 (O, from which D is summed, is stored in bf16).
    const double floor_unit = is_float ? 0x1p-24 : 0x1p-8;
    double worst = 0.0;  // the largest error / bound
    std::size_t at = 0;
    for (std::size_t i = 0; i < out.got.size(); ++i) {
      if (!std::isfinite(out.want[i])) continue;
      const double b = bound + (out.terms.empty() ? 0.0 : 8.0 * floor_unit * out.terms[i]);
      const double ratio = std::abs(static_cast<double>(out.got[i]) - out.want[i]) / b;
      if (ratio > worst) worst = ratio, at = i;
    }
    if (verbose && world_rank == 0)
      std::fprintf(stderr, "ring_fuzz: rank %d %s error %.3g (bound %.3g, naive %.3g, magnitude %.3g, worst error/bound %.3g)\n",
                   world_rank, out.name, e.max_error, bound, naive_error, e.magnitude, worst);
    if (worst > 1.0)
      failure(std::string(out.name) + "[" + std::to_string(at) + "] error " +
              std::to_string(std::abs(out.got[at] - out.want[at])) + " (bound " + std::to_string(bound) +
              (out.terms.empty() ? "" : " + floor of terms " + std::to_string(out.terms[at])) + ", magnitude " +
              std::to_string(e.magnitude) + ")\n  " + describe(x));
  }
}

/// One input on the ring `comm` (this rank is `rank` of it).
template <class T>
void run_on_ring(MPI_Comm comm, int rank, const Input& x, Failure& failure) {
  BackwardProblem<T> full(x.shape, std::uint64_t{x.seed} + 1);  // seed 0 would make Q the sentinel
  if (x.large_scores)
    for (T& e : full.q) e = from_float<T>(to_float(e) * 256.0f);
  const ShardLayout layout(x.shape.seqlen_q, x.ranks, x.sharding);
  Shard<T> m(full, layout, rank);
  const bool on_last = rank == x.ranks - 1;
  const bool bad = really_bad(x, layout.local_len(x.ranks - 1));
  const std::string named = run_ring<T>(comm, x, m, on_last, bad, failure);
  // Every rank must have thrown the same parameter (or none).
  std::array<char, 64> mine{}, first{};
  std::snprintf(mine.data(), mine.size(), "%s", named.c_str());
  std::vector<char> all(static_cast<std::size_t>(x.ranks) * mine.size());
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()), MPI_CHAR,
                comm);
  std::memcpy(first.data(), all.data(), first.size());
  for (int r = 1; r < x.ranks; ++r)
    if (std::memcmp(first.data(), all.data() + static_cast<std::size_t>(r) * mine.size(), mine.size()) != 0)
      failure("ranks disagree: rank 0 named '" + std::string(first.data()) + "', rank " + std::to_string(r) + " '" +
              std::string(all.data() + static_cast<std::size_t>(r) * mine.size()) + "'\n  " + describe(x));
  if (bad) {
    const std::string want = bad_parameter[static_cast<int>(x.bad)];
    if (named != want)
      failure("named '" + named + "', not '" + want + "'\n  " + describe(x));
    if (x.backward) {  // the forward ran: only the gradients must be untouched
      const T st = from_float<T>(sentinel);
      if (!fuzz::all_bits_equal(m.dq, st) || !fuzz::all_bits_equal(m.dk, st) || !fuzz::all_bits_equal(m.dv, st) ||
          !fuzz::all_bits_equal(m.dsinks, sentinel))
        failure("wrote gradients before throwing\n  " + describe(x));
    } else if (!m.untouched()) {
      failure("wrote outputs before throwing\n  " + describe(x));
    }
    return;
  }
  if (!named.empty()) {
    failure("rejected a valid call, naming " + named + "\n  " + describe(x));
    return;
  }
  check_results<T>(x, full, m, failure);
}

/// Every rank runs every input: the first x.ranks ranks as the ring, the others idle.
void run_input(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const Input x = decode(in);
  if (verbose && world_rank == 0) std::fprintf(stderr, "ring_fuzz: %s\n", describe(x).c_str());
  Failure failure;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank < x.ranks ? 0 : MPI_UNDEFINED, world_rank, &comm);
  if (comm != MPI_COMM_NULL) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    try {
      if (x.bf16) run_on_ring<bf16>(comm, rank, x, failure);
      else run_on_ring<float>(comm, rank, x, failure);
    } catch (const std::exception& e) {
      failure(std::string("an exception other than invalid_argument's: ") + e.what() + "\n  " + describe(x));
    }
    MPI_Comm_free(&comm);
  }
  int mine = failure.failed, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && world_rank == 0) fuzz::fail("ring_fuzz", "a check failed (above)\n  " + describe(x));
}

constexpr std::uint64_t stop = std::numeric_limits<std::uint64_t>::max();

/// The other ranks: every input rank 0 broadcasts, until it says stop.
[[noreturn]] void serve() {
  std::vector<std::uint8_t> bytes;
  for (;;) {
    std::uint64_t size = 0;
    MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (size == stop) break;
    bytes.resize(size);
    if (size) MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD);
    run_input(bytes.data(), bytes.size());
  }
  MPI_Finalize();
  std::exit(0);
}

void stop_serving() {
  std::uint64_t size = stop;
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  MPI_Finalize();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  int provided = 0;
  // Open MPI's handlers of SIGABRT and SIGSEGV would replace libFuzzer's (which does not
  // override a handler already there), and no crash file would be written.
  setenv("OMPI_MCA_opal_signal", "", 1);
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  verbose = std::getenv("RING_FUZZ_VERBOSE") != nullptr;
  if (world_rank != 0) serve();
  std::atexit(stop_serving);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Rank 0 (libFuzzer's driver): every rank runs the same bytes.
  std::uint64_t n = size;
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (size) MPI_Bcast(const_cast<std::uint8_t*>(data), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD);
  run_input(data, size);
  return 0;
}
