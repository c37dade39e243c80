// tileattn/detail/paged_checks.hpp: the argument checks of forward_paged and merge_states,
// run before any work starts so that a bad argument throws (naming it) with nothing
// written: page pools, block table, cache_seqlens and the queries and outputs against them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/detail/forward_checks.hpp"
#include "tileattn/detail/view_checks.hpp"

namespace tileattn::detail {

inline constexpr std::array<const char*, 4> pool_dims{"num_pages", "page_size", "heads_kv", "head_dim"};
inline constexpr std::array<const char*, 2> block_table_dims{"batch", "max_pages"};

/// k_cache and v_cache: [num_pages, page_size, heads_kv, head_dim(_v)] with the same pages;
/// page_size >= 1; a pool may have no pages (then every sequence has no keys).
template <class T>
void check_page_pools(const TensorView<const T>& k, const TensorView<const T>& v) {
  check_view(k, "k_cache", pool_dims, {true, false, false, false});
  check_view(v, "v_cache", pool_dims, {true, false, false, false});
  for (std::size_t d = 0; d < 3; ++d) check_same_extent(k, "k_cache", v, "v_cache", d, pool_dims[d]);
  check_head_dim(k.shape[dim::head_dim], "head_dim");
  check_head_dim(v.shape[dim::head_dim], "head_dim_v");
}

/// A 4-bit pool's rows of blocks against q's (or o's) head_dim: blocks x values_per_block.
template <class KV, class T>
void check_block_head_dim(const TensorView<const KV>& pool, const char* pool_name, const T& rows,
                          const char* rows_name, const char* meaning) {
  constexpr index_t values = values_per_element<KV>;
  const index_t want = pool.shape[dim::head_dim] * values, got = rows.shape[dim::head_dim];
  TILEATTN_REQUIRE(got == want, dim_name(rows_name, "shape", dim::head_dim, meaning),
                   "must equal " + std::string(pool_name) + ".shape[3] = " + std::to_string(pool.shape[dim::head_dim]) +
                       " blocks x " + std::to_string(values) + " values (" + kv_type_name<KV>() + ") = " +
                       std::to_string(want) + ", got " + std::to_string(got) +
                       (got % values != 0 ? " (not a multiple of the block size)" : ""));
}

/// q [batch or 1, seqlen_q, heads_q, head_dim] and o (head_dim_v) against the pools.
template <class T, class KV>
void check_paged_queries(const TensorView<const T>& q, const TensorView<T>& o,
                         const TensorView<const KV>& k, const TensorView<const KV>& v, bool varlen) {
  check_view(q, "q", padded_layout.names, {false, varlen, false, false});
  check_view(o, "o", padded_layout.names, {false, varlen, false, false});
  for (std::size_t d = 0; d < 3; ++d) check_same_extent(q, "q", o, "o", d, padded_layout.names[d]);
  if constexpr (block_quantized_type<KV>) {  // pools of 4-bit blocks: head_dim / values_per_block a row
    check_block_head_dim(k, "k_cache", q, "q", "head_dim");
    check_block_head_dim(v, "v_cache", o, "o", "head_dim_v");
  } else {
    check_same_extent(v, "v_cache", o, "o", dim::head_dim, "head_dim_v");
    check_same_extent(k, "k_cache", q, "q", dim::head_dim, "head_dim");
  }
  TILEATTN_REQUIRE(q.shape[dim::heads] % k.shape[dim::heads] == 0, "k_cache.shape[2] (heads_kv)",
          "num_heads_q = " + std::to_string(q.shape[dim::heads]) + " must be a multiple of num_heads_kv = " +
              std::to_string(k.shape[dim::heads]));
}

/// block_table [batch, max_pages]; cache_seqlens[b] in [0, max_pages * page_size]; the
/// pages a sequence uses (the first ceil(cache_seqlens[b] / page_size) of its row) in
/// [0, num_pages). Entries past them are never read. Returns the longest sequence.
inline index_t check_block_table(const StridedView<const std::int32_t, 2>& table,
                                 std::span<const std::int32_t> seqlens, index_t batch,
                                 index_t num_pages, index_t page_size) {
  check_view(table, "block_table", block_table_dims, {false, true});
  TILEATTN_REQUIRE(table.shape[0] == batch, "block_table.shape[0] (batch)",
          "must equal the batch, " + std::to_string(batch) + ", got " + std::to_string(table.shape[0]));
  TILEATTN_REQUIRE(static_cast<index_t>(seqlens.size()) == batch, "cache_seqlens",
          "needs batch = " + std::to_string(batch) + " entries, got " + std::to_string(seqlens.size()));
  index_t longest = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t len = seqlens[static_cast<std::size_t>(b)];
    if (len < 0) throw invalid_argument("cache_seqlens", "entry " + std::to_string(b) + " is negative: " + std::to_string(len));
    if (ceil_div(len, page_size) > table.shape[1])
      throw invalid_argument("cache_seqlens", "entry " + std::to_string(b) + " = " + std::to_string(len) +
                                                  " needs more than the block table's " + std::to_string(table.shape[1]) +
                                                  " pages of " + std::to_string(page_size) + " keys");
    for (index_t j = 0; j * page_size < len; ++j) {
      const std::int32_t page = table(b, j);
      if (page < 0 || page >= num_pages)  // the message is built only on failure: a decode step checks every page
        throw invalid_argument("block_table", "entry [" + std::to_string(b) + ", " + std::to_string(j) + "] = " +
                                                  std::to_string(page) + " is outside the pool's " +
                                                  std::to_string(num_pages) + " pages");
    }
    longest = std::max(longest, len);
  }
  return longest;
}

}  // namespace tileattn::detail
