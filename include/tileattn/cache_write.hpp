// tileattn/cache_write.hpp: page pools of a paged K/V cache and write_kv_slots(), which copies
// new K/V rows into them by slot mapping (vLLM's reshape_and_cache).
//
// Slot s is row s % page_size of page s / page_size; token i of k_new/v_new goes to slot
// slot_mapping[i] of k_cache/v_cache, and slot -1 skips the token (a padding token):
//
//   std::vector<float> k_pool(P * S * Hkv * D), v_pool(P * S * Hkv * D);
//   std::vector<std::int64_t> slots{3 * S + 0, 3 * S + 1, -1};   // tokens 0, 1 to page 3
//   tileattn::write_kv_slots(tileattn::make_thd(k.data(), 3, Hkv, D),   // make_thd: forward.hpp
//                            tileattn::make_thd(v.data(), 3, Hkv, D),
//                            tileattn::make_page_pool(k_pool.data(), P, S, Hkv, D),
//                            tileattn::make_page_pool(v_pool.data(), P, S, Hkv, D), slots);
//
// Quantized pools (fp8_e4m3, fp8_e5m2, int8: core/quantized_types.hpp) take new rows in
// float, bf16 or fp16 and their scales [num_pages or 1, heads_kv or 1] (PageScaleView), and
// quantize as they write. fp8 scales are fixed (per K/V head or per tensor): a value beyond
// the format's range at that scale saturates. int8 scales are per (page, K/V head),
// [num_pages, heads_kv], and grow as values arrive: a page's scale is its largest
// magnitude so far / 127 (0 for a page that holds nothing yet: set a new page's scales to
// 0); a token that raises it requantizes that page's rows of that head once, so a write
// touches only the pages it writes into and no earlier page ever changes.
//
// Rotary embedding (RotaryOptions, core/params.hpp): given the tables and one position per
// token (vLLM's `positions`), write_kv_slots rotates each K row at its token's position as
// it writes it (V is never rotated), before an 8-bit pool quantizes it; apply_rotary rotates
// rows in place with the same arithmetic (the unfused pass, e.g. for Q and K of a backward).
//
// Every argument is checked before anything is written; a bad one throws
// tileattn::invalid_argument naming it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cmath>

#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/detail/rotary_checks.hpp"
#include "tileattn/detail/view_checks.hpp"
#include "tileattn/ops/rotary.hpp"

namespace tileattn {

/// Page pool of a paged K or V cache: [num_pages, page_size, heads_kv, head_dim]
/// (FlashAttention's and vLLM's layout), any non-negative strides.
template <class T>
using PagePoolView = TensorView<T>;

/// Scales of a quantized page pool: [num_pages or 1, heads_kv or 1] (extent 1 broadcasts),
/// float; written by write_kv_slots for int8 pools ([num_pages, heads_kv] then).
using PageScaleView = StridedView<float, 2>;

/// A view over a contiguous [num_pages, heads_kv] buffer of per-(page, K/V head) scales.
inline PageScaleView make_page_scales(float* data, index_t num_pages, index_t heads_kv) {
  return {data, {num_pages, heads_kv}, {heads_kv, 1}};
}

/// How a page's rows lie in memory. Either way a pool is the view [num_pages, page_size,
/// heads_kv, head_dim] and a page is one contiguous block; only the strides inside it differ.
///   token_major: [page, token, head, dim], FlashAttention's and vLLM's flash layout. One K/V
///                head's rows of a page are heads_kv x head_dim elements apart.
///   head_major:  [page, head, token, dim], vLLM's paged-attention layout. One K/V head's
///                rows of a page are one contiguous run.
///   automatic:   the one a decode step reads faster for the element type (docs/paged.md,
///                measured with caches flushed): head_major for float, bf16 and fp16 (10-70%
///                faster on the Xeon, 0-20% on Zen 5), token_major for 8-bit types, whose
///                decode streams several heads' rows of a page together (head-major: 20%
///                slower to 9% faster).
enum class PageLayout { automatic, token_major, head_major };

inline const char* to_string(PageLayout layout) {
  switch (layout) {
    case PageLayout::automatic: return "automatic";
    case PageLayout::token_major: return "token_major";
    case PageLayout::head_major: return "head_major";
  }
  return "invalid";
}

/// `layout` for pools of T: automatic resolved, the others as given.
template <class T>
constexpr PageLayout resolved_layout(PageLayout layout) {
  if (layout != PageLayout::automatic) return layout;
  return sizeof(T) == 1 ? PageLayout::token_major : PageLayout::head_major;
}

/// A view over a contiguous buffer of num_pages pages of page_size x heads_kv x head_dim
/// elements, laid out as `layout` says: [num_pages, page_size, heads_kv, head_dim] either way.
template <class T>
PagePoolView<T> make_page_pool(T* data, index_t num_pages, index_t page_size, index_t heads_kv,
                               index_t head_dim, PageLayout layout = PageLayout::token_major) {
  const index_t page = page_size * heads_kv * head_dim;
  if (resolved_layout<std::remove_const_t<T>>(layout) == PageLayout::head_major)
    return {data, {num_pages, page_size, heads_kv, head_dim}, {page, head_dim, page_size * head_dim, 1}};
  return {data, {num_pages, page_size, heads_kv, head_dim}, {page, heads_kv * head_dim, head_dim, 1}};
}

namespace detail {

inline constexpr std::array<const char*, 3> new_k_dims{"num_tokens", "heads_kv", "head_dim"};
inline constexpr std::array<const char*, 3> new_v_dims{"num_tokens", "heads_kv", "head_dim_v"};
inline constexpr std::array<const char*, 4> k_pool_dims{"num_pages", "page_size", "heads_kv", "head_dim"};
inline constexpr std::array<const char*, 4> v_pool_dims{"num_pages", "page_size", "heads_kv", "head_dim_v"};
inline constexpr EmptyExtents<3> tokens_may_be_empty{true, false, false};

/// rows [num_tokens, heads_kv, head_dim] has the pool's heads_kv and head_dim.
template <class T, class U>
void check_rows_match_pool(const StridedView<T, 3>& rows, const std::string& rows_name,
                           const std::array<const char*, 3>& rows_dims, const PagePoolView<U>& pool,
                           const std::string& pool_name) {
  for (std::size_t d : {1u, 2u})
    TILEATTN_REQUIRE(rows.shape[d] == pool.shape[d + 1], dim_name(rows_name, "shape", d, rows_dims[d]),
            "must equal " + pool_name + ".shape[" + std::to_string(d + 1) + "] = " +
                std::to_string(pool.shape[d + 1]) + ", got " + std::to_string(rows.shape[d]));
}

/// The views and shapes of a slot write; the pools (both written) must not overlap each
/// other, the new rows or the slot mapping (read while they are written).
template <class S, class T>
void check_kv_write(const StridedView<const S, 3>& k_new, const StridedView<const S, 3>& v_new,
                    std::span<const std::int64_t> slots, const PagePoolView<T>& k_cache,
                    const PagePoolView<T>& v_cache) {
  check_view(k_new, "k_new", new_k_dims, tokens_may_be_empty);
  check_view(v_new, "v_new", new_v_dims, tokens_may_be_empty);
  check_view(k_cache, "k_cache", k_pool_dims);
  check_view(v_cache, "v_cache", v_pool_dims);
  check_no_self_overlap(k_cache, "k_cache");
  check_no_self_overlap(v_cache, "v_cache");
  check_same_extent(k_cache, "k_cache", v_cache, "v_cache", 0, "num_pages");
  check_same_extent(k_cache, "k_cache", v_cache, "v_cache", 1, "page_size");
  check_same_extent(k_new, "k_new", v_new, "v_new", 0, "num_tokens");
  check_rows_match_pool(k_new, "k_new", new_k_dims, k_cache, "k_cache");
  check_rows_match_pool(v_new, "v_new", new_v_dims, v_cache, "v_cache");
  check_disjoint(k_cache, "k_cache", k_new, "k_new");
  check_disjoint(k_cache, "k_cache", v_new, "v_new");
  check_disjoint(v_cache, "v_cache", k_new, "k_new");
  check_disjoint(v_cache, "v_cache", v_new, "v_new");
  check_no_shared_element(v_cache, "v_cache", k_cache, "k_cache");  // they may interleave
  check_disjoint(k_cache, "k_cache", array_view(slots), "slot_mapping");
  check_disjoint(v_cache, "v_cache", array_view(slots), "slot_mapping");
}

/// One slot per token, each in [-1, num_slots), no slot twice.
inline void check_slot_mapping(std::span<const std::int64_t> slots, index_t num_tokens,
                               index_t num_slots) {
  TILEATTN_REQUIRE(static_cast<index_t>(slots.size()) == num_tokens, "slot_mapping",
          "has " + std::to_string(slots.size()) + " entries, k_new has " + std::to_string(num_tokens) +
              " tokens");
  std::vector<std::pair<std::int64_t, std::size_t>> used;  // (slot, index), slots >= 0
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < -1 || slots[i] >= num_slots)  // the message is built only on failure
      throw invalid_argument("slot_mapping", "slot_mapping[" + std::to_string(i) + "] = " + std::to_string(slots[i]) +
                                                 " is outside [-1, num_pages x page_size = " +
                                                 std::to_string(num_slots) + ")");
    if (slots[i] >= 0) used.emplace_back(slots[i], i);
  }
  std::sort(used.begin(), used.end());
  const auto twice = std::adjacent_find(used.begin(), used.end(),
                                        [](const auto& a, const auto& b) { return a.first == b.first; });
  if (twice == used.end()) return;
  throw invalid_argument("slot_mapping", "duplicate: slot_mapping[" + std::to_string(twice->second) +
                                             "] and slot_mapping[" + std::to_string(std::next(twice)->second) +
                                             "] are both slot " + std::to_string(twice->first));
}

/// pool[page, row, :, :] = rows[token, :, :].
template <class T>
void copy_token(const StridedView<const T, 3>& rows, index_t token, const PagePoolView<T>& pool,
                index_t page, index_t row) {
  for (index_t h = 0; h < rows.shape[1]; ++h)
    for (index_t d = 0; d < rows.shape[2]; ++d) pool(page, row, h, d) = rows(token, h, d);
}

/// x[0, head_dim) = rows[token, head, :] as floats (exact).
template <class S>
void head_row(const StridedView<const S, 3>& rows, index_t token, index_t head, float* x) {
  for (index_t d = 0; d < rows.shape[2]; ++d) x[d] = to_float(rows(token, head, d));
}

/// x (rows[token, head, :] as floats) rotated at `position` and rounded to T: what a rotated
/// row of T holds.
template <class T>
void rotate_stored(const RotaryOptions& rotary, float* x, index_t position) {
  ops::rotate_row(rotary, x, position);
  ops::round_through<T>(x, rotary.rotary_dim());
}

/// copy_token with each head's row rotated at `position` (x: scratch of head_dim floats).
template <class T>
void copy_rotated_token(const StridedView<const T, 3>& rows, index_t token, const PagePoolView<T>& pool,
                        index_t page, index_t row, const RotaryOptions& rotary, index_t position, float* x) {
  for (index_t h = 0; h < rows.shape[1]; ++h) {
    head_row(rows, token, h, x);
    rotate_stored<T>(rotary, x, position);
    for (index_t d = 0; d < rows.shape[2]; ++d) pool(page, row, h, d) = from_float<T>(x[d]);  // exact
  }
}

/// An output of a rotating write (a pool, int8 scales, rows rotated in place) must not
/// overlap what the rotation reads: the tables and the positions.
template <class Out>
void check_apart_from_rotary(const RotaryOptions& rotary, std::span<const std::int64_t> positions, const Out& out,
                             const std::string& name) {
  if (!rotary.enabled()) return;
  check_disjoint_from_tables(rotary, out, name);
  check_disjoint(out, name, array_view(positions), "positions");
}

/// A quantized pool's scale view: [num_pages or 1, heads_kv or 1] (int8: exactly
/// [num_pages, heads_kv], not overlapping itself or the slot mapping, as it is written),
/// disjoint from the pools and new rows,
/// and, for the pages `slots` write, finite and > 0 (fp8) or >= 0 (int8). Returns it with
/// broadcast extents as stride 0.
template <quantized_type Q, class S>
PageScaleView check_page_scales(const PageScaleView& scales, const char* name, const PagePoolView<Q>& pool,
                                std::span<const std::int64_t> slots, const StridedView<const S, 3>& k_new,
                                const StridedView<const S, 3>& v_new, const PagePoolView<Q>& k_cache,
                                const PagePoolView<Q>& v_cache) {
  constexpr std::array<const char*, 2> dims{"num_pages", "heads_kv"};
  check_view(scales, name, dims);
  const std::array<index_t, 2> want{pool.shape[0], pool.shape[2]};
  PageScaleView out = scales;
  for (std::size_t d = 0; d < 2; ++d) {
    const bool broadcast = !adaptive_scale<Q> && scales.shape[d] == 1;
    TILEATTN_REQUIRE(broadcast || scales.shape[d] == want[d], dim_name(name, "shape", d, dims[d]),
                     std::string("must be ") + (adaptive_scale<Q> ? "" : "1 or ") + std::to_string(want[d]) +
                         ", got " + std::to_string(scales.shape[d]));
    if (broadcast) out = out.broadcast(static_cast<int>(d), want[d]);  // else shape[d] is want[d]
  }
  if constexpr (adaptive_scale<Q>) {
    check_no_self_overlap(scales, name);
    check_disjoint(scales, name, array_view(slots), "slot_mapping");
  }
  check_disjoint(scales, name, k_cache, "k_cache");
  check_disjoint(scales, name, v_cache, "v_cache");
  check_disjoint(scales, name, k_new, "k_new");
  check_disjoint(scales, name, v_new, "v_new");
  const index_t page_size = pool.shape[1];
  for (const std::int64_t slot : slots) {
    if (slot < 0) continue;
    for (index_t h = 0; h < want[1]; ++h) {
      const float x = out(slot / page_size, h);
      if (!(std::isfinite(x) && (adaptive_scale<Q> ? x >= 0.0f : x > 0.0f)))
        throw invalid_argument(name, "entry [" + std::to_string(slot / page_size) + ", " + std::to_string(h) +
                                         "] = " + readable(x) + " must be finite and " +
                                         (adaptive_scale<Q> ? ">= 0 (0: a page that holds nothing yet)" : "> 0"));
    }
  }
  return out;
}

/// pool[page, :, head, :] requantized from scale `from` to the larger `to` (int8; int8_nan
/// stays): what a page's rows of one head become when a new value raises its scale.
template <class Q>
void requantize_page_head(const PagePoolView<Q>& pool, index_t page, index_t head, float from, float to) {
  for (index_t r = 0; r < pool.shape[1]; ++r)
    for (index_t d = 0; d < pool.shape[3]; ++d) {
      Q& q = pool(page, r, head, d);
      if (q != int8_nan) q = quantize_int8(static_cast<float>(q) * from, to);
    }
}

/// pool[page, row, :, :] = rows[token, :, :] quantized at each head's scale, each head's row
/// first rotated in float at `position` when `rotary` is set (x: scratch of head_dim floats);
/// an int8 page's scale first grows to the row's largest finite magnitude / 127 if that is
/// larger (requantizing the page's earlier rows of that head).
template <class Q, class S>
void quantize_token(const StridedView<const S, 3>& rows, index_t token, const PagePoolView<Q>& pool,
                    const PageScaleView& scales, index_t page, index_t row, const RotaryOptions& rotary,
                    index_t position, float* x) {
  const index_t dim = rows.shape[2];
  for (index_t h = 0; h < rows.shape[1]; ++h) {
    head_row(rows, token, h, x);
    if (rotary.enabled()) ops::rotate_row(rotary, x, position);
    float& scale = scales(page, h);
    if constexpr (adaptive_scale<Q>) {
      float absmax = 0.0f;
      for (index_t d = 0; d < dim; ++d)
        if (std::isfinite(x[d])) absmax = std::max(absmax, std::abs(x[d]));
      if (absmax > scale * int8_max) {
        const float grown = absmax / int8_max;
        if (scale > 0.0f) requantize_page_head(pool, page, h, scale, grown);
        scale = grown;
      }
    }
    for (index_t d = 0; d < dim; ++d) pool(page, row, h, d) = quantize<Q>(x[d], scale);
  }
}

/// The rotary arguments of a write into k_cache and v_cache (and int8 scales): tables,
/// positions of the tokens written, and the outputs apart from both.
template <class K, class V>
void check_write_rotary(const RotaryOptions& rotary, std::span<const std::int64_t> positions,
                        std::span<const std::int64_t> slots, index_t num_tokens, const PagePoolView<K>& k_cache,
                        const PagePoolView<V>& v_cache) {
  check_rotary_write(rotary, positions, slots, num_tokens, k_cache.shape[3], "k_new");
  check_apart_from_rotary(rotary, positions, k_cache, "k_cache");
  check_apart_from_rotary(rotary, positions, v_cache, "v_cache");
}

}  // namespace detail

/// Writes token i's K/V rows into slot slot_mapping[i] (page slot / page_size, row
/// slot % page_size) of k_cache and v_cache; slot -1 skips the token.
/// k_new [num_tokens, heads_kv, head_dim], v_new [num_tokens, heads_kv, head_dim_v], the
/// caches' page pools [num_pages, page_size, heads_kv, head_dim(_v)]; T is float, bf16 or
/// fp16; k_new and v_new hold the caches' type and may be const or not.
/// With rotary tables (RotaryOptions), token i's K row is written rotated at positions[i]
/// (num_tokens entries, each a row of the tables; a skipped token's is not read), rounded
/// once to T: the bits apply_rotary would give it. V is written as it is.
template <class SK, class SV, class T>
  requires(!quantized_type<T> && !block_pool_type<T>)  // those quantize: below, block_cache_write.hpp
void write_kv_slots(const StridedView<SK, 3>& k_new, const StridedView<SV, 3>& v_new, PagePoolView<T> k_cache,
                    PagePoolView<T> v_cache, std::span<const std::int64_t> slot_mapping,
                    const RotaryOptions& rotary = {}, std::span<const std::int64_t> positions = {}) {
  static_assert(storage_type<T>, "tileattn: write_kv_slots: the caches must hold float, bf16 or fp16");
  static_assert(std::is_same_v<std::remove_const_t<SK>, T> && std::is_same_v<std::remove_const_t<SV>, T>,
                "tileattn: write_kv_slots: k_new and v_new must hold the caches' element type");
  const StridedView<const T, 3> k_rows = k_new, v_rows = v_new;
  detail::check_kv_write(k_rows, v_rows, slot_mapping, k_cache, v_cache);
  const index_t page_size = k_cache.shape[1];
  detail::check_slot_mapping(slot_mapping, k_rows.shape[0], k_cache.shape[0] * page_size);
  detail::check_write_rotary(rotary, positions, slot_mapping, k_rows.shape[0], k_cache, v_cache);
  std::vector<float> x(rotary.enabled() ? static_cast<std::size_t>(k_rows.shape[2]) : 0);
  for (std::size_t i = 0; i < slot_mapping.size(); ++i) {
    const std::int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    const auto token = static_cast<index_t>(i);
    if (rotary.enabled())
      detail::copy_rotated_token(k_rows, token, k_cache, slot / page_size, slot % page_size, rotary, positions[i],
                                 x.data());
    else
      detail::copy_token(k_rows, token, k_cache, slot / page_size, slot % page_size);
    detail::copy_token(v_rows, token, v_cache, slot / page_size, slot % page_size);
  }
}

/// Rotates rows [num_tokens, heads, head_dim] (float, bf16 or fp16) in place, token i at
/// positions[i], with the arithmetic of the fused paths (the forward's Q load and the cache
/// writes' K): the unfused pass (vLLM's rotary_embedding), and how Q and K reach a call that
/// does not rotate (the backward, ring attention). Checked as write_kv_slots' rotary
/// arguments; rows must not overlap themselves, the tables or the positions.
template <class T>
void apply_rotary(const StridedView<T, 3>& rows, std::span<const std::int64_t> positions,
                  const RotaryOptions& rotary) {
  static_assert(storage_type<T>, "tileattn: apply_rotary rotates rows of float, bf16 or fp16 (not const)");
  constexpr std::array<const char*, 3> dims{"num_tokens", "heads", "head_dim"};
  detail::check_view(rows, "rows", dims, detail::tokens_may_be_empty);
  detail::check_no_self_overlap(rows, "rows");
  TILEATTN_REQUIRE(rotary.enabled(), "rotary_cos", "data is null: apply_rotary needs the tables");
  detail::check_rotary_write(rotary, positions, {}, rows.shape[0], rows.shape[2], "rows");
  detail::check_apart_from_rotary(rotary, positions, rows, "rows");
  const StridedView<const T, 3> in = rows;
  std::vector<float> buffer(static_cast<std::size_t>(rows.shape[2]));
  float* x = buffer.data();
  for (index_t i = 0; i < rows.shape[0]; ++i)
    for (index_t h = 0; h < rows.shape[1]; ++h) {
      detail::head_row(in, i, h, x);
      detail::rotate_stored<T>(rotary, x, positions[static_cast<std::size_t>(i)]);
      for (index_t d = 0; d < rows.shape[2]; ++d) rows(i, h, d) = from_float<T>(x[d]);  // exact
    }
}

}  // namespace tileattn

namespace tileattn {

namespace detail {
/// The quantizing writes' loop (8-bit here, 4-bit in block_cache_write.hpp): f(token, page,
/// row in the page, position) for each token whose slot is >= 0 (position: the token's
/// rotary position, 0 without rotary).
template <class F>
void for_each_slot(std::span<const std::int64_t> slot_mapping, index_t page_size, const RotaryOptions& rotary,
                   std::span<const std::int64_t> positions, F&& f) {
  for (std::size_t i = 0; i < slot_mapping.size(); ++i) {
    const std::int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    f(static_cast<index_t>(i), slot / page_size, slot % page_size, rotary.enabled() ? positions[i] : 0);
  }
}
}  // namespace detail

/// write_kv_slots into quantized pools (fp8_e4m3, fp8_e5m2 or std::int8_t): k_new and v_new
/// in float, bf16 or fp16 are quantized as they are written, at k_scale / v_scale
/// [num_pages or 1, heads_kv or 1]: fixed for fp8 (each > 0), per (page, K/V head) and
/// grown by the write for int8 ([num_pages, heads_kv], each >= 0; a new page's are 0). The
/// header comment says how int8 scales grow. With rotary tables, K rows are rotated in float
/// at their positions before they are quantized (and before an int8 scale grows to them).
/// Checked as write_kv_slots; nothing is written (scales included) when a check fails.
template <quantized_type Q, class SK, class SV>
void write_kv_slots(const StridedView<SK, 3>& k_new, const StridedView<SV, 3>& v_new, PagePoolView<Q> k_cache,
                    PagePoolView<Q> v_cache, std::span<const std::int64_t> slot_mapping, PageScaleView k_scale,
                    PageScaleView v_scale, const RotaryOptions& rotary = {},
                    std::span<const std::int64_t> positions = {}) {
  using S = std::remove_const_t<SK>;
  static_assert(storage_type<S> && std::is_same_v<S, std::remove_const_t<SV>>,
                "tileattn: write_kv_slots: new K and V rows for a quantized cache must both hold float, bf16 or fp16");
  const StridedView<const S, 3> k_rows = k_new, v_rows = v_new;
  detail::check_kv_write(k_rows, v_rows, slot_mapping, k_cache, v_cache);
  const index_t page_size = k_cache.shape[1];
  detail::check_slot_mapping(slot_mapping, k_rows.shape[0], k_cache.shape[0] * page_size);
  const PageScaleView ks =
      detail::check_page_scales(k_scale, "k_scale", k_cache, slot_mapping, k_rows, v_rows, k_cache, v_cache);
  const PageScaleView vs =
      detail::check_page_scales(v_scale, "v_scale", v_cache, slot_mapping, k_rows, v_rows, k_cache, v_cache);
  if constexpr (adaptive_scale<Q>) detail::check_disjoint(k_scale, "k_scale", v_scale, "v_scale");
  detail::check_write_rotary(rotary, positions, slot_mapping, k_rows.shape[0], k_cache, v_cache);
  if constexpr (adaptive_scale<Q>) {  // written too
    detail::check_apart_from_rotary(rotary, positions, k_scale, "k_scale");
    detail::check_apart_from_rotary(rotary, positions, v_scale, "v_scale");
  }
  std::vector<float> x(static_cast<std::size_t>(std::max(k_rows.shape[2], v_rows.shape[2])));
  detail::for_each_slot(slot_mapping, page_size, rotary, positions, [&](index_t token, index_t page, index_t row,
                                                                        index_t position) {
    detail::quantize_token(k_rows, token, k_cache, ks, page, row, rotary, position, x.data());
    detail::quantize_token(v_rows, token, v_cache, vs, page, row, RotaryOptions{}, 0, x.data());
  });
}

}  // namespace tileattn
