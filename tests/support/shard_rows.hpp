// tests/support/shard_rows.hpp: one rank's rows of a full-sequence tensor or LSE, cut by a
// ring::ShardLayout, as doubles: what ring attention's tests and fuzz harness compare each
// rank's shard with (the single-process result or the double reference of the whole
// sequence).
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "tileattn/core/half_types.hpp"
#include "tileattn/distributed/shard.hpp"

namespace tileattn::test {

/// Any element type as double: arithmetic types directly, bf16 / fp16 through float.
template <class E>
double shard_value(const E& x) {
  if constexpr (std::is_arithmetic_v<E>) return static_cast<double>(x);
  else return static_cast<double>(to_float(x));
}

/// Rank `rank`'s rows of a full [batch, seqlen, heads, dim] tensor, as doubles.
template <class E>
std::vector<double> shard_rows(const std::vector<E>& full, const ring::ShardLayout& layout, int rank, index_t batch,
                               index_t seqlen, index_t heads, index_t dim) {
  const index_t n = layout.local_len(rank);
  std::vector<double> out(static_cast<std::size_t>(batch * n * heads * dim));
  for (index_t b = 0; b < batch; ++b)
    for (int c = 0; c < layout.chunks_per_rank(); ++c) {
      const ring::Chunk ch = layout.chunk(rank, c);
      for (index_t i = 0; i < ch.length; ++i)
        for (index_t x = 0; x < heads * dim; ++x)
          out[static_cast<std::size_t>(((b * n + ch.local_start + i) * heads) * dim + x)] =
              shard_value(full[static_cast<std::size_t>(((b * seqlen + ch.start + i) * heads) * dim + x)]);
    }
  return out;
}

/// The same for a full [batch, heads, seqlen] LSE (batch_heads = batch x heads).
template <class E>
std::vector<double> shard_lse_rows(const std::vector<E>& full, const ring::ShardLayout& layout, int rank,
                                   index_t batch_heads, index_t seqlen) {
  const index_t n = layout.local_len(rank);
  std::vector<double> out(static_cast<std::size_t>(batch_heads * n));
  for (index_t bh = 0; bh < batch_heads; ++bh)
    for (int c = 0; c < layout.chunks_per_rank(); ++c) {
      const ring::Chunk ch = layout.chunk(rank, c);
      for (index_t i = 0; i < ch.length; ++i)
        out[static_cast<std::size_t>(bh * n + ch.local_start + i)] =
            shard_value(full[static_cast<std::size_t>(bh * seqlen + ch.start + i)]);
    }
  return out;
}

}  // namespace tileattn::test
