// tileattn/block_cache_write.hpp: write_kv_slots into 4-bit page pools (q4_0, MXFP4,
// NVFP4 blocks: core/block_quantized_types.hpp), quantizing each new row as it is written.
//
// A 4-bit pool is [num_pages, page_size, heads_kv, head_dim / values_per_block] blocks; new
// rows are [num_tokens, heads_kv, head_dim] in float, bf16 or fp16, head_dim a multiple of
// the block's value count. Each block of a row takes its own scale from its own values
// (the codec's rule), so a write touches only the slots it writes: no page scale grows and
// no earlier row is ever requantized (unlike int8's per-page scales, cache_write.hpp).
// Rotary tables rotate each K row in float at its position before it is quantized; into
// pools of hadamard_rotated<B> (core/block_quantized_types.hpp), each K row (after rotary)
// and each V row is then turned by the normalised Walsh-Hadamard transform
// (ops/hadamard.hpp), which spreads outlier channels over the row before the blocks take
// their scales (forward_paged over those pools undoes it: the pools' type says so, there is
// no flag to forget). Checked as write_kv_slots; a bad argument throws
// tileattn::invalid_argument naming it, with nothing written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tileattn/cache_write.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/ops/hadamard.hpp"

namespace tileattn {

namespace detail {

/// rows [num_tokens, heads_kv, head_dim] against a block pool: heads_kv equal, head_dim =
/// the pool's blocks x values_per_block.
template <block_quantized_type B, class S>
void check_rows_match_block_pool(const StridedView<const S, 3>& rows, const char* rows_name,
                                 const std::array<const char*, 3>& rows_dims, const PagePoolView<B>& pool,
                                 const char* pool_name) {
  TILEATTN_REQUIRE(rows.shape[1] == pool.shape[2], dim_name(rows_name, "shape", 1, rows_dims[1]),
                   "must equal " + std::string(pool_name) + ".shape[2] = " + std::to_string(pool.shape[2]) +
                       ", got " + std::to_string(rows.shape[1]));
  const index_t want = pool.shape[3] * B::values;
  TILEATTN_REQUIRE(rows.shape[2] == want, dim_name(rows_name, "shape", 2, rows_dims[2]),
                   "must equal " + std::string(pool_name) + ".shape[3] = " + std::to_string(pool.shape[3]) +
                       " blocks x " + std::to_string(B::values) + " values (" + kv_type_name<B>() + ") = " +
                       std::to_string(want) + ", got " + std::to_string(rows.shape[2]));
}

/// pool[page, row, h, :] = rows[token, h, :] quantized block by block, each head's row first
/// rotated in float at `position` when `rotary` is set, then by H when `hadamard` is (x:
/// scratch of head_dim floats).
template <block_quantized_type B, class S>
void quantize_token_blocks(const StridedView<const S, 3>& rows, index_t token, const PagePoolView<B>& pool,
                           index_t page, index_t row, const RotaryOptions& rotary, index_t position, bool hadamard,
                           float* x) {
  for (index_t h = 0; h < rows.shape[1]; ++h) {
    head_row(rows, token, h, x);
    if (rotary.enabled()) ops::rotate_row(rotary, x, position);
    if (hadamard) ops::hadamard_row(x, rows.shape[2]);
    for (index_t c = 0; c < pool.shape[3]; ++c) pool(page, row, h, c) = quantize_block<B>(x + c * B::values);
  }
}

}  // namespace detail

/// write_kv_slots into 4-bit block pools: token i's rows (float, bf16 or fp16) quantized
/// into slot slot_mapping[i] (-1: skipped), K rotated at positions[i] first when `rotary`
/// has tables, then, into pools of hadamard_rotated<B>, K and V by H (head_dim and
/// head_dim_v powers of two). Pools [num_pages, page_size, heads_kv, head_dim(_v) /
/// values_per_block].
template <block_pool_type P, class SK, class SV>
void write_kv_slots(const StridedView<SK, 3>& k_new, const StridedView<SV, 3>& v_new, PagePoolView<P> k_cache,
                    PagePoolView<P> v_cache, std::span<const std::int64_t> slot_mapping,
                    const RotaryOptions& rotary = {}, std::span<const std::int64_t> positions = {}) {
  using B = stored_block_t<P>;  // the blocks the codec writes
  constexpr bool hadamard = is_hadamard_rotated<P>;
  const PagePoolView<B> k_blocks = reinterpret_view<B>(k_cache), v_blocks = reinterpret_view<B>(v_cache);  // as B
  using S = std::remove_const_t<SK>;
  static_assert(storage_type<S> && std::is_same_v<S, std::remove_const_t<SV>>,
                "tileattn: write_kv_slots: new K and V rows for a 4-bit cache must both hold float, bf16 or fp16");
  const StridedView<const S, 3> k_rows = k_new, v_rows = v_new;
  detail::check_view(k_rows, "k_new", detail::new_k_dims, detail::tokens_may_be_empty);
  detail::check_view(v_rows, "v_new", detail::new_v_dims, detail::tokens_may_be_empty);
  detail::check_view(k_blocks, "k_cache", detail::k_pool_dims);
  detail::check_view(v_blocks, "v_cache", detail::v_pool_dims);
  detail::check_no_self_overlap(k_blocks, "k_cache");
  detail::check_no_self_overlap(v_blocks, "v_cache");
  detail::check_same_extent(k_blocks, "k_cache", v_blocks, "v_cache", 0, "num_pages");
  detail::check_same_extent(k_blocks, "k_cache", v_blocks, "v_cache", 1, "page_size");
  detail::check_same_extent(k_rows, "k_new", v_rows, "v_new", 0, "num_tokens");
  detail::check_rows_match_block_pool(k_rows, "k_new", detail::new_k_dims, k_blocks, "k_cache");
  detail::check_rows_match_block_pool(v_rows, "v_new", detail::new_v_dims, v_blocks, "v_cache");
  for (const auto& [pool, name] : {std::pair{k_blocks, "k_cache"}, std::pair{v_blocks, "v_cache"}}) {
    detail::check_disjoint(pool, name, k_rows, "k_new");
    detail::check_disjoint(pool, name, v_rows, "v_new");
    detail::check_disjoint(pool, name, detail::array_view(slot_mapping), "slot_mapping");
    detail::check_apart_from_rotary(rotary, positions, pool, name);
  }
  detail::check_no_shared_element(v_blocks, "v_cache", k_blocks, "k_cache");
  const index_t page_size = k_blocks.shape[1];
  detail::check_slot_mapping(slot_mapping, k_rows.shape[0], k_blocks.shape[0] * page_size);
  detail::check_rotary_write(rotary, positions, slot_mapping, k_rows.shape[0], k_rows.shape[2], "k_new");
  if constexpr (hadamard)
    for (const auto& [rows, name] : {std::pair{&k_rows, "k_new.shape[2] (head_dim)"},
                                     std::pair{&v_rows, "v_new.shape[2] (head_dim_v)"}})
      TILEATTN_REQUIRE(ops::hadamard_length(rows->shape[2]), name,
                       std::string("must be a power of two for pools of ") + kv_type_name<P>() + ", got " +
                           std::to_string(rows->shape[2]));
  std::vector<float> x(static_cast<std::size_t>(std::max(k_rows.shape[2], v_rows.shape[2])));
  detail::for_each_slot(slot_mapping, page_size, rotary, positions, [&](index_t token, index_t page, index_t row,
                                                                        index_t position) {
    detail::quantize_token_blocks(k_rows, token, k_blocks, page, row, rotary, position, hadamard, x.data());
    detail::quantize_token_blocks(v_rows, token, v_blocks, page, row, RotaryOptions{}, 0, hadamard, x.data());
  });
}

}  // namespace tileattn
