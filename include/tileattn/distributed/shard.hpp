// tileattn/distributed/shard.hpp: how ring attention splits one sequence across P ranks,
// and the helpers that cut a full tensor into a rank's shard and put it back. No MPI here.
//
// The sequence of N tokens is cut into pieces of N / pieces tokens (the first N % pieces
// pieces one longer). Sharding::contiguous: P pieces, rank r holds piece r. Under a causal
// mask rank P-1 then does P times the work of rank 0. Sharding::zigzag (the default): 2P
// pieces, rank r holds pieces r and 2P-1-r (an early and a late one, as Striped Attention
// and Llama 3's context parallelism balance it): every rank's queries see the same number
// of causal keys, give or take one piece's rounding. A rank's shard is its pieces
// concatenated in order: local row `local_start + i` of chunk c is global row `start + i`.
//
//   tileattn::ring::ShardLayout layout(N, P);                // zig-zag
//   tileattn::ring::shard(q_full, q_local, layout, rank);    // [B, N, H, D] -> [B, n_r, H, D]
//   tileattn::ring::unshard(o_local, o_full, layout, rank);  // and back
#pragma once

#include <array>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/detail/view_checks.hpp"

namespace tileattn::ring {

enum class Sharding { contiguous, zigzag };

/// One piece of a rank's shard: global rows [start, start + length), at local rows
/// [local_start, local_start + length).
struct Chunk {
  index_t start = 0, length = 0, local_start = 0;
};

/// How a sequence of `seqlen` tokens is split over `ranks` processes.
class ShardLayout {
 public:
  ShardLayout(index_t seqlen, int ranks, Sharding sharding = Sharding::zigzag)
      : seqlen_(seqlen), ranks_(ranks), sharding_(sharding) {
    TILEATTN_REQUIRE(seqlen >= 0, "seqlen", "must be >= 0, got " + std::to_string(seqlen));
    TILEATTN_REQUIRE(ranks >= 1, "ranks", "must be >= 1, got " + std::to_string(ranks));
    TILEATTN_REQUIRE(sharding == Sharding::contiguous || sharding == Sharding::zigzag, "sharding",
                     "must be Sharding::contiguous or Sharding::zigzag");
  }

  index_t seqlen() const { return seqlen_; }
  int ranks() const { return ranks_; }
  Sharding sharding() const { return sharding_; }
  int chunks_per_rank() const { return sharding_ == Sharding::zigzag ? 2 : 1; }

  /// Chunk c (0 or, zig-zag, 1) of `rank`'s shard.
  Chunk chunk(int rank, int c) const {
    const int piece = c == 0 ? rank : 2 * ranks_ - 1 - rank;
    const index_t local_start = c == 0 ? 0 : piece_length(rank);
    return {piece_start(piece), piece_length(piece), local_start};
  }
  std::array<Chunk, 2> chunks(int rank) const {
    return {chunk(rank, 0), chunks_per_rank() == 2 ? chunk(rank, 1) : Chunk{}};
  }
  /// Rows of `rank`'s shard.
  index_t local_len(int rank) const {
    index_t n = 0;
    for (int c = 0; c < chunks_per_rank(); ++c) n += chunk(rank, c).length;
    return n;
  }
  /// The longest shard: the size of a K/V block in transit.
  index_t max_local_len() const {
    index_t n = 0;
    for (int r = 0; r < ranks_; ++r) n = std::max(n, local_len(r));
    return n;
  }
  friend bool operator==(const ShardLayout&, const ShardLayout&) = default;

 private:
  index_t pieces() const { return static_cast<index_t>(ranks_) * chunks_per_rank(); }
  index_t piece_start(index_t p) const { return p * (seqlen_ / pieces()) + std::min(p, seqlen_ % pieces()); }
  index_t piece_length(index_t p) const { return seqlen_ / pieces() + (p < seqlen_ % pieces() ? 1 : 0); }

  index_t seqlen_;
  int ranks_;
  Sharding sharding_;
};

namespace detail {

template <class In, class Out, int R>
void check_shard_views(const StridedView<In, R>& full, const StridedView<Out, R>& local, int seq_dim,
                       const ShardLayout& layout, int rank) {
  TILEATTN_REQUIRE(rank >= 0 && rank < layout.ranks(), "rank",
                   "must be in [0, " + std::to_string(layout.ranks()) + "), got " + std::to_string(rank));
  TILEATTN_REQUIRE(full.data != nullptr || layout.seqlen() == 0, "full", "data is null");
  TILEATTN_REQUIRE(local.data != nullptr || layout.local_len(rank) == 0, "local", "data is null");
  for (int d = 0; d < R; ++d) {
    const index_t want = d == seq_dim ? layout.seqlen() : local.shape[d];
    TILEATTN_REQUIRE(full.shape[d] == want, "full",
                     "shape[" + std::to_string(d) + "] must be " + std::to_string(want) + ", got " +
                         std::to_string(full.shape[d]));
    TILEATTN_REQUIRE(full.stride[d] >= 0 && local.stride[d] >= 0, "stride", "strides must be >= 0");
  }
  TILEATTN_REQUIRE(local.shape[seq_dim] == layout.local_len(rank), "local",
                   "shape[" + std::to_string(seq_dim) + "] must be rank " + std::to_string(rank) + "'s " +
                       std::to_string(layout.local_len(rank)) + " rows, got " + std::to_string(local.shape[seq_dim]));
}

/// Calls copy(global_row, local_row) for every row of `rank`'s shard.
template <class F>
void for_each_shard_row(const ShardLayout& layout, int rank, F&& copy) {
  for (int c = 0; c < layout.chunks_per_rank(); ++c) {
    const Chunk chunk = layout.chunk(rank, c);
    for (index_t i = 0; i < chunk.length; ++i) copy(chunk.start + i, chunk.local_start + i);
  }
}

/// dst(..., row at seq_dim, ...) = src(..., row, ...) over every index of a view of rank R
/// whose extent at seq_dim is 1 (the caller moves both views to the row).
template <class Dst, class Src, int R>
void copy_elements(const StridedView<Dst, R>& dst, const StridedView<Src, R>& src) {
  std::array<index_t, R> at{};
  const auto walk = [&](auto&& self, int d) -> void {
    if (d == R) {
      index_t od = 0, os = 0;
      for (int e = 0; e < R; ++e) od += at[e] * dst.stride[e], os += at[e] * src.stride[e];
      dst.data[od] = src.data[os];
      return;
    }
    for (at[d] = 0; at[d] < dst.shape[d]; ++at[d]) self(self, d + 1);
  };
  walk(walk, 0);
}

}  // namespace detail

namespace detail {

/// Copies `rank`'s rows between full and local: into local (shard) or back into full.
template <class From, class To, int R>
void copy_shard_rows(const StridedView<From, R>& from, const StridedView<To, R>& to, bool into_local,
                     const ShardLayout& layout, int rank, int seq_dim) {
  TILEATTN_REQUIRE(seq_dim >= 0 && seq_dim < R, "seq_dim", "must be a dimension of the views");
  if (into_local) check_shard_views(from, to, seq_dim, layout, rank);
  else check_shard_views(to, from, seq_dim, layout, rank);
  for_each_shard_row(layout, rank, [&](index_t global, index_t row) {
    copy_elements(to.slice(seq_dim, into_local ? row : global, 1), from.slice(seq_dim, into_local ? global : row, 1));
  });
}

}  // namespace detail

/// local = `rank`'s rows of full, along dimension seq_dim (1 for [B, N, H, D] tensors, 2
/// for [B, H, N] log-sum-exps).
template <class In, class Out, int R>
void shard(const StridedView<In, R>& full, const StridedView<Out, R>& local, const ShardLayout& layout, int rank,
           int seq_dim = 1) {
  detail::copy_shard_rows(full, local, true, layout, rank, seq_dim);
}

/// The inverse: `rank`'s rows of full = local. Each rank writes only its own rows.
template <class In, class Out, int R>
void unshard(const StridedView<In, R>& local, const StridedView<Out, R>& full, const ShardLayout& layout, int rank,
             int seq_dim = 1) {
  detail::copy_shard_rows(local, full, false, layout, rank, seq_dim);
}

}  // namespace tileattn::ring
