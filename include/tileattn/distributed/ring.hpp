// tileattn/distributed/ring.hpp: ring attention over MPI (Liu et al., 2023): one sequence's
// attention, forward and backward, across the P ranks of a communicator, each holding a
// shard of Q, K, V (distributed/shard.hpp says which rows).
//
//   tileattn::ring::ShardLayout layout(N, P);  // zig-zag: balanced under a causal mask
//   tileattn::ring::forward(MPI_COMM_WORLD, layout, q, k, v, o, lse, opts);
//   tileattn::ring::backward(MPI_COMM_WORLD, layout, q, k, v, o, lse, dout, dq, dk, dv, bopts);
//
// Forward: each rank keeps its queries; the K/V blocks travel around the ring (rank r sends
// to r+1), P - 1 steps, the next block received (MPI_Isend / MPI_Irecv) while the current
// one is computed (with MPI_THREAD_SERIALIZED or above, a thread keeps those transfers
// moving during the compute; otherwise they move between kernels). A step runs the
// single-process kernel on each (query chunk, key chunk) pair that any query can see, with
// ScoreOptions::diagonal_offset = the chunks' position difference, so causal, window and
// ALiBi see global positions; the sink joins the local diagonal pair only. Each pair's
// state (its O and each row's max score and sum, kept apart as split-KV keeps them) merges
// exactly in a fixed order (step, then chunk pair): results do not depend on timing and are
// the same bits on every run.
// Backward: the same ring (after one more pass of the blocks where some LSE is so large that
// its rounding would spoil P: the row statistics over every rank's keys, computed from the
// backward's own scores); dQ accumulates locally, dK/dV accumulate in fp32 buffers that
// travel with their K/V block and come home after P shifts, summed in ring order; dsinks
// are summed over ranks in rank order.
//
// Arguments are checked on every rank and compared across ranks (collectively, before any
// transfer): every rank throws tileattn::invalid_argument, or none does. With one rank the
// call is the local kernel. Options: everything forward() takes except a bias or mask
// (an O(N^2) tensor does not shard) and diagonal_offset (set here per chunk pair); K/V in
// the storage type of Q (float, bf16, fp16). docs/distributed.md has the model and numbers.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tileattn/backward.hpp"
#include "tileattn/checked.hpp"
#include "tileattn/distributed/ring_comm.hpp"
#include "tileattn/distributed/shard.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/ops/merge_states.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::ring {

/// Where a ring call's time went, on this rank.
struct RingStats {
  int steps = 0;                  // ring steps (P)
  double seconds = 0.0;           // the whole call
  double compute_seconds = 0.0;   // chunk-pair kernels, merges and gradient sums
  double wait_seconds = 0.0;      // blocked in MPI waits: transfers not hidden, or slower neighbours
  std::uint64_t bytes_sent = 0;   // K/V blocks (and, backward, dK/dV accumulators) sent
  std::vector<double> step_compute_seconds, step_wait_seconds;
};

namespace detail {

/// Rows [start, start + len) of a [B, S, ...] view along dimension `dim`.
template <class T, int R>
StridedView<T, R> rows(StridedView<T, R> v, index_t start, index_t len, int dim = 1) {
  return v.slice(dim, start, len);
}

/// True when some query of chunk qc can see some key of chunk kc under `o`'s causal mask
/// and window (the global positions differ by qc.start - kc.start).
inline bool pair_visible(const ScoreOptions& o, const Chunk& qc, const Chunk& kc) {
  if (qc.length == 0 || kc.length == 0) return false;
  const index_t offset = qc.start - kc.start;  // query i is aligned with key i + offset
  const index_t right = o.causal ? 0 : o.window_right;
  // A side at least `reach` wide is unbounded here (as in ops::KeyWindow), and the sums
  // below never overflow.
  const index_t reach = qc.length + kc.length + (offset < 0 ? -offset : offset);
  index_t lo = -(qc.length - 1), hi = kc.length - 1;  // j - i over the pair
  if (o.window_left >= 0 && o.window_left < reach) lo = std::max(lo, offset - o.window_left);
  if (right >= 0 && right < reach) hi = std::min(hi, offset + right);
  return lo <= hi;
}

/// The options of one chunk pair: its diagonal; the sink (and its gradient) only on the
/// local diagonal pair, so that each row's softmax counts it once.
template <class Options>
Options pair_options(const Options& base, const Chunk& qc, const Chunk& kc, bool diagonal, IoCounts* io) {
  Options o = base;
  o.diagonal_offset = qc.start - kc.start;
  o.io_counts = base.io_counts ? io : nullptr;
  if (!diagonal) o.sinks = {};
  return o;
}

/// Buffers of blocks in transit (two: one computed on and sent, one received), each holding
/// tensors [B, rows, heads, dims[i]] of T one after the other.
template <class T>
class BlockBuffers {
 public:
  BlockBuffers(index_t batch, index_t rows, index_t heads, std::vector<index_t> dims, int count = 2)
      : batch_(batch), rows_(rows), heads_(heads), dims_(std::move(dims)), buffers_(static_cast<std::size_t>(count)) {
    for (index_t d : dims_) size_ += static_cast<std::size_t>(batch * rows * heads * d);
    for (auto& b : buffers_) b.assign(size_, T{});
  }
  void fill(int buffer, T value) { std::fill(data(buffer), data(buffer) + size_, value); }
  TensorView<T> part(int buffer, int i) {
    T* at = buffers_[static_cast<std::size_t>(buffer)].data();
    for (int p = 0; p < i; ++p) at += batch_ * rows_ * heads_ * dims_[static_cast<std::size_t>(p)];
    return make_bshd(at, batch_, rows_, heads_, dims_[static_cast<std::size_t>(i)]);
  }
  T* data(int buffer) { return buffers_[static_cast<std::size_t>(buffer)].data(); }
  std::size_t bytes() const { return size_ * sizeof(T); }

 private:
  index_t batch_, rows_, heads_;
  std::vector<index_t> dims_;
  std::size_t size_ = 0;
  std::vector<std::vector<T>> buffers_;
};

/// The rows of `rank`'s longest chunk: the size of one pair's partial output.
inline index_t longest_chunk(const ShardLayout& layout, int rank) {
  index_t rows = 0;
  for (int c = 0; c < layout.chunks_per_rank(); ++c) rows = std::max(rows, layout.chunk(rank, c).length);
  return rows;
}

/// dst = src element by element (the views have one shape), rounded once to D, parallel
/// over (batch, row).
template <class D, class S>
void copy_into(const TensorView<D>& dst, const TensorView<S>& src, const Execution& exec = {}) {
  parallel_for(exec, dst.shape[0] * dst.shape[1], [&](index_t item, int) {
    const index_t b = item / dst.shape[1], i = item % dst.shape[1];
    for (index_t h = 0; h < dst.shape[2]; ++h)
      for (index_t c = 0; c < dst.shape[3]; ++c) {
        if constexpr (std::is_same_v<D, std::remove_const_t<S>>) dst(b, i, h, c) = src(b, i, h, c);
        else dst(b, i, h, c) = from_float<D>(to_float(src(b, i, h, c)));
      }
  });
}

/// acc += part, as floats, parallel over (batch, row).
template <class T>
void add_into(const TensorView<float>& acc, const TensorView<T>& part, const Execution& exec) {
  const index_t rows = acc.shape[0] * acc.shape[1];
  parallel_for(exec, rows, [&](index_t item, int) {
    const index_t b = item / acc.shape[1], i = item % acc.shape[1];
    for (index_t h = 0; h < acc.shape[2]; ++h)
      for (index_t c = 0; c < acc.shape[3]; ++c) acc(b, i, h, c) += to_float(part(b, i, h, c));
  });
}

inline double now() { return MPI_Wtime(); }

/// The checks every rank makes of its own shard before the collective comparison. A rank
/// whose shard has no rows (seqlen < 2P) makes only these: the kernels' checks want rows,
/// and the ranks that have some check the options every rank agrees on.
inline void check_ring(const RingComm& ring, const ShardLayout& layout, const ForwardOptions& options,
                       index_t q_rows, index_t k_rows, index_t v_rows) {
  TILEATTN_REQUIRE(layout.seqlen() > 0, "layout", "seqlen must be > 0, got 0");
  TILEATTN_REQUIRE(layout.ranks() == ring.size, "layout",
                   "has " + std::to_string(layout.ranks()) + " ranks, the communicator " + std::to_string(ring.size));
  const index_t n = layout.local_len(ring.rank);
  const auto rows_of = [&](const char* name, index_t got) {
    TILEATTN_REQUIRE(got == n, name,
                     std::string("shape[1] (seqlen) must be rank ") + std::to_string(ring.rank) + "'s shard of " +
                         std::to_string(n) + " rows (ShardLayout::local_len), got " + std::to_string(got));
  };
  rows_of("q", q_rows);
  rows_of("k", k_rows);
  rows_of("v", v_rows);
  TILEATTN_REQUIRE(options.bias.data == nullptr, "bias", "is not supported by ring attention (it does not shard)");
  TILEATTN_REQUIRE(options.mask.data == nullptr, "mask", "is not supported by ring attention (it does not shard)");
  TILEATTN_REQUIRE(!options.diagonal_offset, "diagonal_offset", "is set by ring attention for each chunk pair; leave it unset");
  TILEATTN_REQUIRE(!options.dropout.enabled(), "dropout.p",
                   "must be 0 in ring attention: its chunks see shard positions, not the sequence's");
  TILEATTN_REQUIRE(options.attention_chunk == 0, "attention_chunk",
                   "is not supported by ring attention yet (its chunks would start at each shard's first key)");
  TILEATTN_REQUIRE(!options.rotary.enabled(), "rotary_cos",
                   "is not supported by ring attention (its chunk pairs align by offset, not by position): rotate Q "
                   "and K before the call (apply_rotary)");
}

/// What every rank must agree on: the layout, the shapes and the options.
template <class T>
std::vector<Field> agreed_fields(const ShardLayout& layout, const TensorView<const T>& q, const TensorView<const T>& k,
                                 const TensorView<const T>& v, const ForwardOptions& o, bool dsinks) {
  const float scale = checked::default_scale(o, q.shape[3]);
  return {{"layout.seqlen", layout.seqlen()},
          {"layout.sharding", static_cast<std::int64_t>(layout.sharding())},
          {"batch", q.shape[0]},
          {"heads_q", q.shape[2]},
          {"heads_kv", k.shape[2]},
          {"head_dim", q.shape[3]},
          {"head_dim_v", v.shape[3]},
          {"element type", std::is_same_v<T, float> ? 0 : std::is_same_v<T, bf16> ? 1 : 2},
          {"causal", o.causal},
          {"window_left", o.window_left},
          {"window_right", o.window_right},
          float_field("softcap", o.softcap),
          float_field("softmax_scale", scale),
          hash_field("alibi_slopes", o.alibi_slopes),
          hash_field("sinks", o.sinks),
          {"sinks.size", static_cast<std::int64_t>(o.sinks.size())},
          {"dsinks", dsinks}};
}

/// Calls f(qc, kc, diagonal) for each (query chunk of `rank`, key chunk of `src`) pair that
/// some query can see, in the fixed order the merge depends on. diagonal: a chunk paired
/// with itself (the local step), the only pair that carries the sink.
template <class F>
void for_each_pair(const ShardLayout& layout, int rank, int src, const ScoreOptions& options, F&& f) {
  for (int qi = 0; qi < layout.chunks_per_rank(); ++qi)
    for (int ki = 0; ki < layout.chunks_per_rank(); ++ki) {
      const Chunk qc = layout.chunk(rank, qi), kc = layout.chunk(src, ki);
      if (pair_visible(options, qc, kc)) f(qc, kc, rank == src && qi == ki);
    }
}

/// Runs a step's compute, body(between_kernels), while `in_flight` transfers move: on a
/// progress thread when MPI allows one, else in between_kernels() calls.
template <class Body>
void compute_while_moving(std::initializer_list<Exchange*> in_flight, Body&& body) {
  const BackgroundProgress background(in_flight);
  body([&] {
    if (!background.active())
      for (Exchange* e : in_flight) e->progress();
  });
}

/// Where the time of the step just run went (compute, then waits), added to `st`.
inline void record_step(RingStats& st, double compute, double wait) {
  st.step_compute_seconds.push_back(compute);
  st.step_wait_seconds.push_back(wait);
  st.compute_seconds += compute;
  st.wait_seconds += wait;
}

/// A rank's row statistics [batch, heads, rows]: each row's max score (log2 units) and sum
/// of 2^(score - max), kept apart, into which each pair's statistics merge exactly
/// (ops::merge_row_stats, as split-KV's states merge). Its views point into its own buffers:
/// it is neither copied nor moved.
class RankRowStats {
 public:
  RankRowStats(index_t batch, index_t heads, index_t rows)
      : max_(static_cast<std::size_t>(batch * heads * rows), -std::numeric_limits<float>::infinity()),
        sum_(max_.size(), 0.0f), max_view_(make_lse(max_.data(), batch, heads, rows)),
        sum_view_(make_lse(sum_.data(), batch, heads, rows)) {}
  RankRowStats(const RankRowStats&) = delete;
  RankRowStats& operator=(const RankRowStats&) = delete;

  /// Row (b, h, row) merged with a pair's (m_c, l_c); the weights its O rows take.
  ops::MergeWeights merge(index_t b, index_t h, index_t row, float m_c, float l_c) {
    return ops::merge_row_stats(max_view_(b, h, row), sum_view_(b, h, row), m_c, l_c);
  }
  float max(index_t b, index_t h, index_t row) const { return max_view_(b, h, row); }
  float sum(index_t b, index_t h, index_t row) const { return sum_view_(b, h, row); }

  /// The statistics of qc's rows, as the backward takes them.
  kernels::SavedRowStats rows_of(const Chunk& qc) const {
    return {rows(StridedView<const float, 3>(max_view_), qc.local_start, qc.length, 2),
            rows(StridedView<const float, 3>(sum_view_), qc.local_start, qc.length, 2)};
  }

 private:
  std::vector<float> max_, sum_;
  StridedView<float, 3> max_view_, sum_view_;
};

/// A rank's forward state over the keys attended so far, merged exactly: O unnormalized
/// (fp32: the sum over pairs of l_c 2^(m_c - max) O_c) and each row's max score (log2
/// units) and sum of 2^(score - max), kept apart (ops::merge_row_stats, as split-KV's states
/// merge: one float LSE per pair would make its rounding, |LSE| 2^-24, the pair's relative
/// weight error, 6e-4 at scores of 1e4), the sink counted once, on the diagonal pair. Each
/// pair runs the forward on fixed tiles (forward_row_stats), so the bits depend on neither
/// the budget nor the thread count.
template <class T>
class ForwardAccumulator {
 public:
  ForwardAccumulator(index_t batch, index_t rows, index_t heads, index_t dv, index_t pair_rows)
      : batch_(batch), rows_(rows), heads_(heads), dv_(dv),
        acc_(static_cast<std::size_t>(batch * rows * heads * dv), 0.0f),
        acc_view_(make_bshd(acc_.data(), batch, rows, heads, dv)), stats_(batch, heads, rows),
        pair_o_(static_cast<std::size_t>(batch * pair_rows * heads * dv)),
        pair_max_(static_cast<std::size_t>(batch * heads * pair_rows)), pair_sum_(pair_max_.size()) {}
  ForwardAccumulator(const ForwardAccumulator&) = delete;
  ForwardAccumulator& operator=(const ForwardAccumulator&) = delete;

  /// Query chunk qc (its rows of q) against key chunk kc (its rows of the K/V block held),
  /// merged into the rows of qc.
  void attend(const TensorView<const T>& q, const TensorView<T>& k_block, const TensorView<T>& v_block,
              const Chunk& qc, const Chunk& kc, const ForwardOptions& options) {
    const TensorView<T> o_c = make_bshd(pair_o_.data(), batch_, qc.length, heads_, dv_);
    ForwardParams<T> f = checked::checked_params<T, T>(rows(q, qc.local_start, qc.length),
                                                       rows(TensorView<const T>(k_block), kc.local_start, kc.length),
                                                       rows(TensorView<const T>(v_block), kc.local_start, kc.length),
                                                       o_c, LseView{}, options);
    f.row_max = make_lse(pair_max_.data(), batch_, heads_, qc.length);
    f.row_sum = make_lse(pair_sum_.data(), batch_, heads_, qc.length);
    const IoCounts io = checked::forward_row_stats(f, qc.length, options.execution, options.io_counts != nullptr,
                                                   ops::BuiltinScores{});
    if (options.io_counts) *options.io_counts = io;
    parallel_for(options.execution, batch_ * qc.length, [&](index_t item, int) {
      const index_t b = item / qc.length, i = item % qc.length, row = qc.local_start + i;
      for (index_t h = 0; h < heads_; ++h) {
        const ops::MergeWeights w = stats_.merge(b, h, row, f.row_max(b, h, i), f.row_sum(b, h, i));
        if (!w.adds) continue;
        for (index_t c = 0; c < dv_; ++c)
          acc_view_(b, row, h, c) = acc_view_(b, row, h, c) * w.rescale + w.weight * to_float(o_c(b, i, h, c));
      }
    });
  }

  /// o and lse (when set) = the merged state normalized in place (ops::finalize_row), O
  /// rounded once to T. Once, after the last pair.
  void write(const TensorView<T>& o, const LseView& lse, const Execution& exec) {
    parallel_for(exec, batch_ * rows_, [&](index_t item, int) {
      const index_t b = item / rows_, i = item % rows_;
      for (index_t h = 0; h < heads_; ++h) {
        float m = stats_.max(b, h, i), l = stats_.sum(b, h, i), row_lse = 0.0f;
        float* row = &acc_view_(b, i, h, 0);  // dv contiguous floats
        ops::finalize_row(row, dv_, m, l, row_lse);
        for (index_t c = 0; c < dv_; ++c) o(b, i, h, c) = from_float<T>(row[c]);
        if (lse.data) lse(b, h, i) = row_lse;
      }
    });
  }

 private:
  index_t batch_, rows_, heads_, dv_;
  std::vector<float> acc_;
  TensorView<float> acc_view_;
  RankRowStats stats_;
  std::vector<T> pair_o_;
  std::vector<float> pair_max_, pair_sum_;
};

/// One pass of K/V around the ring (P steps, the next block received while the current one
/// is computed): at each step acc.attend(q, K block, V block, qc, kc, pair options) for each
/// pair of this rank's query chunks and the held block's key chunks that a query can see.
/// The pairs' IO into io_total, the steps' times and bytes into st.
template <class T, class Acc, class Options>
void forward_pass(const RingComm& ring, const ShardLayout& layout, const TensorView<const T>& q,
                  const TensorView<const T>& k, const TensorView<const T>& v, const Options& options, Acc& acc,
                  IoCounts& io_total, RingStats& st) {
  const index_t n = q.shape[1];
  BlockBuffers<T> blocks(q.shape[0], layout.max_local_len(), k.shape[2], {k.shape[3], v.shape[3]});
  copy_into(rows(blocks.part(0, 0), 0, n), k, options.execution);
  copy_into(rows(blocks.part(0, 1), 0, n), v, options.execution);
  IoCounts io_pair;
  Exchange kv;
  for (int step = 0; step < ring.size; ++step) {
    const int cur = step % 2;
    if (step + 1 < ring.size) kv.post(ring, blocks.data(cur), blocks.data(1 - cur), blocks.bytes(), 1000 + step);
    const double t0 = now();
    compute_while_moving({&kv}, [&](auto&& between_kernels) {
      for_each_pair(layout, ring.rank, ring.source(step), options, [&](const Chunk& qc, const Chunk& kc, bool diagonal) {
        acc.attend(q, blocks.part(cur, 0), blocks.part(cur, 1), qc, kc, pair_options(options, qc, kc, diagonal, &io_pair));
        io_total += io_pair;
        between_kernels();
      });
    });
    const double t1 = now();
    kv.wait();
    record_step(st, t1 - t0, now() - t1);
  }
  st.bytes_sent += kv.bytes_sent();
}

template <class T>
void ring_forward(MPI_Comm comm, const ShardLayout& layout, TensorView<const T> q, TensorView<const T> k,
                  TensorView<const T> v, TensorView<T> o, LseView lse, const ForwardOptions& options, RingStats* stats) {
  const double start = now();
  const RingComm ring(comm);
  const index_t n = q.shape[1];
  agree(ring, [&] {
    check_ring(ring, layout, options, q.shape[1], k.shape[1], v.shape[1]);
    if (n > 0) checked::checked_params<T, T>(q, k, v, o, lse, options);
  }, agreed_fields(layout, q, k, v, options, false));
  RingStats st;
  st.steps = ring.size;
  if (ring.size == 1) {  // the local kernel: the whole sequence is here, in order
    checked::forward<T, T>(q, k, v, o, lse, options);
    record_step(st, now() - start, 0.0);
  } else {
    ForwardAccumulator<T> acc(q.shape[0], n, q.shape[2], v.shape[3], longest_chunk(layout, ring.rank));
    IoCounts io_total;
    forward_pass(ring, layout, q, k, v, options, acc, io_total, st);
    acc.write(o, lse, options.execution);  // every transfer is done: the outputs are written only now
    if (options.io_counts) *options.io_counts = io_total;
  }
  st.seconds = now() - start;
  if (stats) *stats = std::move(st);
}

/// The row statistics a rank's backward takes P from where some saved LSE is too coarse
/// (exact_row_stats_lse): over every rank's keys, each pair's computed as that pair's
/// backward computes its scores (checked::backward_row_stats: the same product and tiles,
/// so that s c - max is exact for a row's largest score) and merged exactly
/// (ops::merge_row_stats), in the fixed pair order.
template <class T>
class RowStatsAccumulator {
 public:
  RowStatsAccumulator(const TensorView<const T>& o, const StridedView<const float, 3>& lse,
                      const TensorView<const T>& dout, index_t heads_kv, index_t head_dim, index_t block_rows,
                      index_t pair_rows)
      : o_(o), lse_(lse), dout_(dout), batch_(o.shape[0]), heads_(o.shape[2]), stats_(batch_, heads_, o.shape[1]),
        pair_max_(static_cast<std::size_t>(batch_ * heads_ * pair_rows)), pair_sum_(pair_max_.size()),
        unused_dq_(static_cast<std::size_t>(batch_ * pair_rows * heads_ * head_dim)),
        unused_dk_(static_cast<std::size_t>(batch_ * block_rows * heads_kv * head_dim)),
        unused_dv_(static_cast<std::size_t>(batch_ * block_rows * heads_kv * o.shape[3])),
        heads_kv_(heads_kv), head_dim_(head_dim) {}

  /// Query chunk qc against key chunk kc: the pair's statistics, merged into qc's rows.
  void attend(const TensorView<const T>& q, const TensorView<T>& k_block, const TensorView<T>& v_block,
              const Chunk& qc, const Chunk& kc, BackwardOptions options) {
    options.dsinks = {};
    const auto q_rows = [&](const auto& t) { return rows(t, qc.local_start, qc.length); };
    const LseView pair_max = make_lse(pair_max_.data(), batch_, heads_, qc.length);
    const LseView pair_sum = make_lse(pair_sum_.data(), batch_, heads_, qc.length);
    const IoCounts io = checked::backward_row_stats<T>(
        q_rows(q), rows(TensorView<const T>(k_block), kc.local_start, kc.length),
        rows(TensorView<const T>(v_block), kc.local_start, kc.length), q_rows(o_), rows(lse_, qc.local_start, qc.length, 2),
        q_rows(dout_), make_bshd(unused_dq_.data(), batch_, qc.length, heads_, head_dim_),
        make_bshd(unused_dk_.data(), batch_, kc.length, heads_kv_, head_dim_),
        make_bshd(unused_dv_.data(), batch_, kc.length, heads_kv_, o_.shape[3]), options, pair_max, pair_sum);
    if (options.io_counts) *options.io_counts = io;
    for (index_t b = 0; b < batch_; ++b)
      for (index_t h = 0; h < heads_; ++h)
        for (index_t i = 0; i < qc.length; ++i) stats_.merge(b, h, qc.local_start + i, pair_max(b, h, i), pair_sum(b, h, i));
  }

  /// The statistics of qc's rows, as the backward takes them.
  kernels::SavedRowStats rows_of(const Chunk& qc) const { return stats_.rows_of(qc); }

 private:
  TensorView<const T> o_;
  StridedView<const float, 3> lse_;
  TensorView<const T> dout_;
  index_t batch_, heads_;
  RankRowStats stats_;
  std::vector<float> pair_max_, pair_sum_;
  std::vector<T> unused_dq_, unused_dk_, unused_dv_;
  index_t heads_kv_, head_dim_;
};

/// Whether some rank's saved LSE has a row the backward must not recompute P from
/// (exact_row_stats_lse): every rank gets the same answer.
inline bool any_large_lse(const RingComm& ring, const StridedView<const float, 3>& lse) {
  int mine = 0;
  for (index_t b = 0; b < lse.shape[0] && !mine; ++b)
    for (index_t h = 0; h < lse.shape[1] && !mine; ++h)
      for (index_t i = 0; i < lse.shape[2] && !mine; ++i) mine = checked::large_lse(lse(b, h, i)) ? 1 : 0;
  int any = 0;
  mpi_check(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, ring.comm), "MPI_Allreduce");
  return any != 0;
}

/// A rank's backward state: dQ of its rows (fp32), the dK/dV accumulators that travel with
/// the K/V blocks (fp32; at step t buffer t % 2 holds the accumulator of the block held,
/// then is sent on while the other receives the next), this step's dK/dV, dsinks, and one
/// pair's gradient buffers.
template <class T>
class BackwardAccumulators {
 public:
  BackwardAccumulators(index_t batch, index_t rows, index_t block_rows, index_t heads, index_t heads_kv, index_t d,
                       index_t dv, index_t pair_rows)
      : batch_(batch), heads_(heads), heads_kv_(heads_kv), d_(d), dv_(dv),
        travelling_(batch, block_rows, heads_kv, {d, dv}), step_(batch, block_rows, heads_kv, {d, dv}, 1),
        dq_(static_cast<std::size_t>(batch * rows * heads * d), 0.0f), dsinks_(static_cast<std::size_t>(heads), 0.0f),
        pair_dq_(static_cast<std::size_t>(batch * pair_rows * heads * d)),
        pair_dk_(static_cast<std::size_t>(batch * block_rows * heads_kv * d)),
        pair_dv_(static_cast<std::size_t>(batch * block_rows * heads_kv * dv)),
        pair_dq32_(pair_dq_.size()), pair_dk32_(pair_dk_.size()), pair_dv32_(pair_dv_.size()),
        pair_dsinks_(dsinks_.size()),
        dq_view_(make_bshd(dq_.data(), batch, rows, heads, d)) {}

  void start_step() { step_.fill(0, 0.0f); }
  /// The travelling dK/dV accumulators (two buffers) and this rank's dsinks sum.
  BlockBuffers<float>& travelling() { return travelling_; }
  std::vector<float>& dsinks() { return dsinks_; }

  /// The gradients of pair (qc, kc): dQ into this rank's rows, dK/dV into this step's.
  void attend(const TensorView<const T>& q, const TensorView<T>& k_block, const TensorView<T>& v_block,
              const TensorView<const T>& o, const StridedView<const float, 3>& lse,
              const kernels::SavedRowStats& row_stats, const TensorView<const T>& dout, const Chunk& qc,
              const Chunk& kc, BackwardOptions options, bool want_dsinks) {
    options.dsinks = want_dsinks ? std::span<float>(pair_dsinks_) : std::span<float>{};
    // The pair's gradients in fp32 (the T views are checked, not written): the sums over
    // pairs round once, at the end, as one backward's do.
    const TensorView<T> dq = make_bshd(pair_dq_.data(), batch_, qc.length, heads_, d_);
    const TensorView<T> dk = make_bshd(pair_dk_.data(), batch_, kc.length, heads_kv_, d_);
    const TensorView<T> dv = make_bshd(pair_dv_.data(), batch_, kc.length, heads_kv_, dv_);
    const TensorView<float> dq32 = make_bshd(pair_dq32_.data(), batch_, qc.length, heads_, d_);
    const TensorView<float> dk32 = make_bshd(pair_dk32_.data(), batch_, kc.length, heads_kv_, d_);
    const TensorView<float> dv32 = make_bshd(pair_dv32_.data(), batch_, kc.length, heads_kv_, dv_);
    const auto q_rows = [&](const auto& t) { return rows(t, qc.local_start, qc.length); };
    checked::backward_fp32_gradients<T>(q_rows(q), rows(k_block, kc.local_start, kc.length),
                                        rows(v_block, kc.local_start, kc.length), q_rows(o),
                                        rows(lse, qc.local_start, qc.length, 2), q_rows(dout), dq, dk, dv, dq32,
                                        dk32, dv32, options,
                                        &row_stats);  // over every rank's keys (empty: P from the saved LSE)
    add_into(q_rows(dq_view_), dq32, options.execution);
    add_into(rows(step_.part(0, 0), kc.local_start, kc.length), dk32, options.execution);
    add_into(rows(step_.part(0, 1), kc.local_start, kc.length), dv32, options.execution);
    if (want_dsinks)
      for (std::size_t h = 0; h < dsinks_.size(); ++h) dsinks_[h] += pair_dsinks_[h];
  }

  /// The held block's accumulator += this step's gradients.
  void add_step(int held, const Execution& exec) {
    add_into(travelling_.part(held, 0), step_.part(0, 0), exec);
    add_into(travelling_.part(held, 1), step_.part(0, 1), exec);
  }

  /// dq, and dk, dv from the accumulator in buffer `home` (this rank's own block), rounded once.
  void write(const TensorView<T>& dq, const TensorView<T>& dk, const TensorView<T>& dv, int home, index_t rows_here,
             const Execution& exec) {
    copy_into(dq, TensorView<const float>(dq_view_), exec);
    copy_into(dk, rows(TensorView<const float>(travelling_.part(home, 0)), 0, rows_here), exec);
    copy_into(dv, rows(TensorView<const float>(travelling_.part(home, 1)), 0, rows_here), exec);
  }

 private:
  index_t batch_, heads_, heads_kv_, d_, dv_;
  BlockBuffers<float> travelling_, step_;
  std::vector<float> dq_, dsinks_;
  std::vector<T> pair_dq_, pair_dk_, pair_dv_;  // checked, not written
  std::vector<float> pair_dq32_, pair_dk32_, pair_dv32_;
  std::vector<float> pair_dsinks_;
  TensorView<float> dq_view_;
};

template <class T>
void ring_backward(MPI_Comm comm, const ShardLayout& layout, TensorView<const T> q, TensorView<const T> k,
                   TensorView<const T> v, TensorView<const T> o, StridedView<const float, 3> lse,
                   TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
                   const BackwardOptions& options, RingStats* stats) {
  const double start = now();
  const RingComm ring(comm);
  const index_t n = q.shape[1];
  agree(ring, [&] {
    check_ring(ring, layout, options, q.shape[1], k.shape[1], v.shape[1]);
    if (n > 0) checked::checked_backward_params<T>(q, k, v, o, lse, dout, dq, dk, dv, options);
  }, agreed_fields(layout, q, k, v, options, !options.dsinks.empty()));
  RingStats st;
  st.steps = ring.size;
  if (ring.size == 1) {
    checked::backward<T>(q, k, v, o, lse, dout, dq, dk, dv, options);  // every key here
    record_step(st, now() - start, 0.0);
    st.seconds = now() - start;
    if (stats) *stats = std::move(st);
    return;
  }
  const index_t B = q.shape[0], Hkv = k.shape[2], nmax = layout.max_local_len();
  IoCounts io_total, io_pair;
  // Where some LSE is large, the row statistics over every rank's keys first: one more pass
  // of the blocks around the ring (its steps' times in the totals, not in the step lists).
  std::optional<RowStatsAccumulator<T>> row_stats;
  if (any_large_lse(ring, lse)) {
    RingStats pass;
    row_stats.emplace(o, lse, dout, Hkv, q.shape[3], nmax, longest_chunk(layout, ring.rank));
    forward_pass(ring, layout, q, k, v, options, *row_stats, io_total, pass);
    st.compute_seconds += pass.compute_seconds;
    st.wait_seconds += pass.wait_seconds;
    st.bytes_sent += pass.bytes_sent;
  }
  BlockBuffers<T> blocks(B, nmax, Hkv, {q.shape[3], v.shape[3]});
  copy_into(rows(blocks.part(0, 0), 0, n), k, options.execution);
  copy_into(rows(blocks.part(0, 1), 0, n), v, options.execution);
  BackwardAccumulators<T> acc(B, n, nmax, q.shape[2], Hkv, q.shape[3], v.shape[3], longest_chunk(layout, ring.rank));
  Exchange kv, grad;
  for (int step = 0; step < ring.size; ++step) {
    const int cur = step % 2, held = step % 2;
    if (step + 1 < ring.size) kv.post(ring, blocks.data(cur), blocks.data(1 - cur), blocks.bytes(), 2000 + step);
    const double t0 = now();
    acc.start_step();
    compute_while_moving({&kv, &grad}, [&](auto&& between_kernels) {
      for_each_pair(layout, ring.rank, ring.source(step), options, [&](const Chunk& qc, const Chunk& kc, bool diagonal) {
        acc.attend(q, blocks.part(cur, 0), blocks.part(cur, 1), o, lse,
                   row_stats ? row_stats->rows_of(qc) : kernels::SavedRowStats{}, dout, qc, kc,
                   pair_options(options, qc, kc, diagonal, &io_pair), diagonal && !options.dsinks.empty());
        io_total += io_pair;
        between_kernels();
      });
    });
    // The held block's accumulator: zero for this rank's own block, else the one the
    // previous rank sent after its step (in flight during this step's compute).
    const double t1 = now();
    if (step == 0) acc.travelling().fill(0, 0.0f);
    else grad.wait();
    const double t2 = now();
    acc.add_step(held, options.execution);
    grad.post(ring, acc.travelling().data(held), acc.travelling().data(1 - held), acc.travelling().bytes(), 3000 + step);
    const double t3 = now();
    kv.wait();
    record_step(st, (t1 - t0) + (t3 - t2), (t2 - t1) + (now() - t3));
  }
  const double t_home = now();
  grad.wait();  // after P shifts each block's accumulator is home
  st.step_wait_seconds.back() += now() - t_home;
  st.wait_seconds += now() - t_home;
  if (!options.dsinks.empty()) sum_in_rank_order(ring, acc.dsinks());
  // Every transfer is done: the outputs are written only now.
  acc.write(dq, dk, dv, ring.size % 2, n, options.execution);
  if (!options.dsinks.empty()) std::copy(acc.dsinks().begin(), acc.dsinks().end(), options.dsinks.begin());
  if (options.io_counts) *options.io_counts = io_total;
  st.bytes_sent += kv.bytes_sent() + grad.bytes_sent();
  st.seconds = now() - start;
  if (stats) *stats = std::move(st);
}

}  // namespace detail

/// Attention of this rank's queries to the whole sequence: o and lse (optional) of the
/// rank's shard, as forward() over the full tensors would give them (within fp32 rounding;
/// the same bits on every run). q, k, v, o: [batch, layout.local_len(rank), heads, dim]
/// shards as shard() cuts them; every rank calls with the same layout, shapes and options.
/// stats (optional: nullptr) receives where this rank's time went.
template <class Q, class K, class V, class O>
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, LseView lse, RingStats* stats,
             const ForwardOptions& options = {}) {
  checked::check_element_types<Q, K, V, O>();
  static_assert(std::is_same_v<std::remove_const_t<K>, O>,
                "tileattn::ring: K and V must have Q's storage type (no 8-bit K/V in ring attention)");
  detail::ring_forward<O>(comm, layout, q, k, v, o, lse, options, stats);
}

/// ring::forward() without the statistics.
template <class Q, class K, class V, class O>
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, LseView lse, const ForwardOptions& options = {}) {
  forward(comm, layout, q, k, v, o, lse, nullptr, options);
}

/// ring::forward() without the log-sum-exp output.
template <class Q, class K, class V, class O>
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, RingStats* stats, const ForwardOptions& options = {}) {
  forward(comm, layout, q, k, v, o, LseView{}, stats, options);
}

/// ring::forward() without the log-sum-exp output or the statistics.
template <class Q, class K, class V, class O>
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, const ForwardOptions& options = {}) {
  forward(comm, layout, q, k, v, o, LseView{}, nullptr, options);
}

/// The gradients of ring::forward: dq, dk, dv of this rank's shard (dk and dv summed over
/// every rank's queries), and options.dsinks summed over all ranks. o and lse are the
/// forward's outputs on this rank; options the forward's; stats as ring::forward's.
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
void backward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
              const TensorView<V>& v, const TensorView<O>& o, SavedLseView lse, const TensorView<DO>& dout,
              const TensorView<DQ>& dq, const TensorView<DK>& dk, const TensorView<DV>& dv, RingStats* stats,
              const BackwardOptions& options = {}) {
  checked::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>();
  static_assert(std::is_same_v<std::remove_const_t<K>, DQ>,
                "tileattn::ring: K and V must have Q's storage type (no 8-bit K/V in ring attention)");
  detail::ring_backward<DQ>(comm, layout, q, k, v, o, lse, dout, dq, dk, dv, options, stats);
}

/// ring::backward() without the statistics.
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
void backward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
              const TensorView<V>& v, const TensorView<O>& o, SavedLseView lse, const TensorView<DO>& dout,
              const TensorView<DQ>& dq, const TensorView<DK>& dk, const TensorView<DV>& dv,
              const BackwardOptions& options = {}) {
  backward(comm, layout, q, k, v, o, lse, dout, dq, dk, dv, nullptr, options);
}

// The former argument order, the statistics after the options (docs/api.md: options last).

/// ring::forward(comm, layout, q, k, v, o, lse, stats, options) in the former order.
template <class Q, class K, class V, class O>
[[deprecated("pass stats before the options: ring::forward(comm, layout, q, k, v, o, lse, stats, options)")]]
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, LseView lse, const ForwardOptions& options,
             RingStats* stats) {
  forward(comm, layout, q, k, v, o, lse, stats, options);
}

/// ring::forward(comm, layout, q, k, v, o, stats, options) in the former order.
template <class Q, class K, class V, class O>
[[deprecated("pass stats before the options: ring::forward(comm, layout, q, k, v, o, stats, options)")]]
void forward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
             const TensorView<V>& v, const TensorView<O>& o, const ForwardOptions& options, RingStats* stats) {
  forward(comm, layout, q, k, v, o, LseView{}, stats, options);
}

/// ring::backward(comm, layout, ..., dv, stats, options) in the former order.
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
[[deprecated("pass stats before the options: ring::backward(comm, layout, ..., dv, stats, options)")]]
void backward(MPI_Comm comm, const ShardLayout& layout, const TensorView<Q>& q, const TensorView<K>& k,
              const TensorView<V>& v, const TensorView<O>& o, SavedLseView lse, const TensorView<DO>& dout,
              const TensorView<DQ>& dq, const TensorView<DK>& dk, const TensorView<DV>& dv,
              const BackwardOptions& options, RingStats* stats) {
  backward(comm, layout, q, k, v, o, lse, dout, dq, dk, dv, stats, options);
}

}  // namespace tileattn::ring
