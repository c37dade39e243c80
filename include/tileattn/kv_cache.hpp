// tileattn/kv_cache.hpp: the paged KV cache manager: a pool of fixed-size pages per layer,
// a block table per sequence, and pages shared between sequences by reference count
// (vLLM's block manager; the pools are FlashAttention's [num_pages, page_size, heads_kv,
// head_dim] views, laid out in memory as KvCacheConfig::layout says).
//
//   tileattn::KvCache<tileattn::bf16> cache({.num_layers = 32, .num_pages = 4096,
//                                            .page_size = 16, .heads_kv = 8, .head_dim = 128});
//   const tileattn::SequenceId prompt = cache.create();
//   // A model step: reserve the new tokens once, then each layer writes its K/V and attends.
//   cache.extend(prompt, n);                          // pages as needed (copy-on-write)
//   const auto tables = cache.batch(std::vector{prompt});  // keep it alive: views point into it
//   for (layer l) {
//     cache.write(l, prompt, k_new, v_new);           // [n, heads_kv, head_dim]: the last n positions
//     tileattn::forward_paged(q, cache.k_pages(l), cache.v_pages(l), tables.block_table_view(),
//                             tables.seqlens(), o, lse, options);
//   }
//   const tileattn::SequenceId beam = cache.fork(prompt);  // shares every page
//   cache.append(beam, k_all, v_all);  // K/V known for every layer up front: [num_layers, n, ...]
//   cache.truncate(beam, cache.length(beam) - 2);     // roll back rejected draft tokens
//
// Pages. A sequence of length L holds ceil(L / page_size) pages, its block table pages();
// token t lies in row t % page_size of page pages()[t / page_size], in every layer's K and V
// pool. A page is free (reference count 0, on the free list) or held by its count of
// sequences. extend and append take the lowest-numbered free pages; fork and share_prefix add
// a reference to pages that exist; truncate and free drop references, and a page whose count
// reaches 0 goes back on the free list. Pages are never cleared: positions that extend
// reserved and nothing wrote yet hold stale values.
//
// Copy-on-write. A sequence writes only into pages it holds alone (count 1). The one shared
// page a sequence can write into next is its partly filled last page (after fork, or
// share_prefix of a token count that is not a multiple of page_size), so extend, when
// length % page_size != 0 and that page's count is > 1, first copies it (K and V, every layer)
// into a fresh page and drops one reference of the old one. Full shared pages are never written
// again (new tokens go to new pages), so they are never copied. write() into a shared page is
// an invalid_argument.
//
// Quantized caches. KvCache<fp8_e4m3>, <fp8_e5m2> and <std::int8_t> store K and V in 8 bits
// (core/quantized_types.hpp): write and append take rows in float, bf16 or fp16 and
// quantize them (cache_write.hpp's write_kv_slots), k_scales(layer) / v_scales(layer) are
// the scale views forward_paged takes (options.k_scale / v_scale). fp8 scales are fixed at
// construction (KvCacheConfig::k_scale / v_scale: one for every head and layer, one per
// K/V head, or one per (layer, K/V head); 1 when empty); int8 scales are per (page, K/V
// head), start at 0 for a page taken from the free list, grow as values arrive, and are
// copied with a page on copy-on-write.
//
// 4-bit caches. KvCache<q4_0_block>, <mxfp4_block> and <nvfp4_block> (core/
// block_quantized_types.hpp) store blocks of 32 (16) 4-bit values with their scale inside:
// the pools are [num_pages, page_size, heads_kv, head_dim / values_per_block] blocks
// (head_dim and head_dim_v must be multiples of the block), write and append quantize rows
// in float, bf16 or fp16 block by block (block_cache_write.hpp), and forward_paged reads the
// pools with no scale options. NVFP4's tensor scale is 1 here. KvCache<hadamard_rotated<B>>
// (B one of the three; head_dim and head_dim_v powers of two) turns each K row (after
// rotary) and V row by the normalised Walsh-Hadamard transform before quantizing it, and its
// k_pages / v_pages are views of hadamard_rotated<B>, from which forward_paged knows to
// rotate Q and O: the rotation is in the type, so the cache and the forward cannot disagree.
//
// Rotary embedding. write and append take RotaryOptions (core/params.hpp: FlashAttention's
// rotary_cos / rotary_sin tables and layout) and then write each K row rotated at its
// position in the sequence (token t: position t), before an 8-bit cache quantizes it, so that
// forward_paged with the same options.rotary attends with Q rotated at the same positions.
//
// Latent caches (MLA, mla.hpp). With KvCacheConfig::latent, a token's row of head_dim per
// K/V head (usually one: kv_lora_rank + the rotary dims) is K and its first head_dim_v columns
// are V: there is no V pool. write_latent / append_latent write the rows (quantized at K's
// scales in an 8-bit cache); v_pages() views the K pool's first columns and v_scales() are
// k_scales(), so forward_paged_mla(q, cache.k_pages(l), ...) and forward_paged with both
// views see the same values. write and append (K and V rows) throw on a latent cache.
//
// Errors. Every call checks its arguments before it changes anything; a bad one throws
// tileattn::invalid_argument naming it ("sequence" for an unknown or freed id). extend and
// append throw out_of_pages (core/error.hpp) when too few pages are free, with every sequence
// and page as it was.
//
// Threads. A KvCache has no lock inside. Const calls (length, pages, batch, the const
// k_pages/v_pages, the counts) and the non-const k_pages/v_pages (which only make views) may
// run concurrently with each other and with kernels reading the pools. The other calls
// (create, fork, share_prefix, extend, write, append, truncate, free) need exclusive access:
// no other call on the cache and no kernel reading its pools at the same time (one thread, or
// an external lock). The pools never move, so views of them stay valid for the cache's
// lifetime; a span from pages() is valid until the next mutating call.
#pragma once

#include <algorithm>
#include <cmath>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tileattn/block_cache_write.hpp"
#include "tileattn/cache_write.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/detail/rotary_checks.hpp"
#include "tileattn/detail/view_checks.hpp"
#include "tileattn/memory/line_aligned.hpp"

namespace tileattn {

struct KvCacheConfig {
  index_t num_layers = 1;
  index_t num_pages = 0;   // pages in the pool (every layer has the same pages)
  index_t page_size = 16;  // tokens per page, any value >= 1
  index_t heads_kv = 0;
  index_t head_dim = 0;
  index_t head_dim_v = 0;  // 0: head_dim
  /// fp8 caches: dequantization scales of K and V, each > 0: empty (1), one value, heads_kv
  /// values (per K/V head) or num_layers x heads_kv (per layer and K/V head). Others: empty.
  std::vector<float> k_scale{}, v_scale{};
  /// How a page's rows lie in memory (cache_write.hpp): head_major ([page, head, token,
  /// dim]: one head's rows of a page contiguous), token_major ([page, token, head, dim],
  /// FlashAttention's layout, for a caller that hands the pools to code expecting it), or
  /// automatic (the default: the one decode reads faster for T, head-major for 16- and
  /// 32-bit types, token-major for 8-bit ones; config() reports the choice). k_pages and
  /// v_pages carry the strides either way.
  PageLayout layout = PageLayout::automatic;
  /// MLA's latent cache (mla.hpp): one row of head_dim per token and K/V head (usually
  /// heads_kv 1: kv_lora_rank + the rotary dims) is K, and its first head_dim_v columns are
  /// V. There is no V pool: v_pages() views the K pool's first head_dim_v columns (and an 8-bit
  /// cache's v_scales() are its k_scales()); write_latent and append_latent write the rows,
  /// write and append throw. fp8: k_scale only.
  bool latent = false;
};

using SequenceId = std::int64_t;

template <class T>
class KvCache {
  static_assert(kv_storage_type<T> || block_pool_type<T>,
                "tileattn: KvCache holds float, tileattn::bf16, tileattn::fp16, tileattn::fp8_e4m3, "
                "tileattn::fp8_e5m2, std::int8_t, tileattn::q4_0_block, mxfp4_block or nvfp4_block, "
                "or one of the three Hadamard-rotated (tileattn::hadamard_rotated<q4_0_block>, ...)");
  static constexpr bool quantized = quantized_type<T>;      // 8 bits, scales beside the pools
  static constexpr bool blocks = block_pool_type<T>;        // 4 bits, scales inside the blocks
  static constexpr bool converts = quantized || blocks;     // rows arrive in float, bf16 or fp16
  static constexpr index_t values_per_row_element = values_per_element<T>;

  /// Whether write() and append() take rows of RowK and RowV, const or not: T, or float, bf16
  /// or fp16 for an 8-bit or 4-bit cache; the same type for K and V.
  template <class RowK, class RowV>
  static constexpr bool takes_rows =
      std::is_same_v<std::remove_const_t<RowK>, std::remove_const_t<RowV>> &&
      (converts ? storage_type<std::remove_const_t<RowK>> : std::is_same_v<std::remove_const_t<RowK>, T>);

 public:
  /// Sequence lengths are int32 (cache_seqlens), and so are page ids (block tables).
  static constexpr index_t max_length = std::numeric_limits<std::int32_t>::max();

  /// A batch's block table [batch, max_pages] (rows padded with page 0; max_pages >= 1) and
  /// its cache_seqlens [batch], as forward_paged takes them.
  struct BatchTables {
    std::vector<std::int32_t> block_table;
    std::vector<std::int32_t> cache_seqlens;
    index_t max_pages = 1;

    StridedView<const std::int32_t, 2> block_table_view() const& {
      return {block_table.data(), {static_cast<index_t>(cache_seqlens.size()), max_pages}, {max_pages, 1}};
    }
    std::span<const std::int32_t> seqlens() const& { return cache_seqlens; }
    // A view of a temporary would dangle: keep the tables, `const auto tables = cache.batch(ids);`.
    void block_table_view() const&& = delete;
    void seqlens() const&& = delete;
  };

  explicit KvCache(const KvCacheConfig& config) : config_(checked(config)) {
    const auto pool = [&](index_t dim) {
      const index_t elements = config_.num_pages * config_.page_size * config_.heads_kv * (dim / values_per_row_element);
      return Pool(static_cast<std::size_t>(elements));
    };
    for (index_t l = 0; l < config_.num_layers; ++l) {
      k_pools_.push_back(pool(config_.head_dim));
      v_pools_.push_back(config_.latent ? Pool() : pool(config_.head_dim_v));
    }
    if constexpr (quantized) {
      const index_t heads = config_.heads_kv;
      for (index_t l = 0; l < config_.num_layers; ++l) {
        if constexpr (adaptive_scale<T>) {  // per (page, head), 0 until written
          k_scales_.emplace_back(static_cast<std::size_t>(config_.num_pages * heads), 0.0f);
          if (!config_.latent) v_scales_.emplace_back(static_cast<std::size_t>(config_.num_pages * heads), 0.0f);
        } else {  // per head, fixed
          k_scales_.push_back(layer_scales(config_.k_scale, l));
          if (!config_.latent) v_scales_.push_back(layer_scales(config_.v_scale, l));
        }
      }
    }
    ref_counts_.assign(static_cast<std::size_t>(config_.num_pages), 0);
    std::vector<std::int32_t> all(static_cast<std::size_t>(config_.num_pages));  // ascending: a min-heap
    for (std::size_t p = 0; p < all.size(); ++p) all[p] = static_cast<std::int32_t>(p);
    free_list_ = FreeList(std::greater<>{}, std::move(all));  // capacity num_pages: pushes never allocate
  }

  /// A new empty sequence.
  SequenceId create() { return add(Sequence{}); }

  /// A new sequence holding all of parent's pages (one more reference each), same length.
  SequenceId fork(SequenceId parent) { return share_prefix(parent, length(parent)); }

  /// A new sequence holding source's first `tokens` tokens: their pages gain a reference (a
  /// partly used last page too, copied when the new sequence first extends into it).
  SequenceId share_prefix(SequenceId source, index_t tokens) {
    const Sequence& s = at(source);
    require_in(tokens >= 0 && tokens <= s.length, "tokens", "[0, length = " + std::to_string(s.length) + "]",
               tokens);
    const SequenceId id = add({{s.pages.begin(), s.pages.begin() + pages_for(tokens)}, tokens});
    for (std::int32_t p : at(id).pages) ++ref_counts_[static_cast<std::size_t>(p)];
    return id;
  }

  /// Reserves n more positions: takes the pages they need and copies a shared, partly filled
  /// last page (copy-on-write). Throws out_of_pages, changing nothing, when too few are free.
  void extend(SequenceId sequence, index_t n) {
    Sequence& s = at(sequence);
    require_in(n >= 0 && n <= max_length - s.length, "n",
               "[0, 2^31 - 1 - length = " + std::to_string(max_length - s.length) + "]", n);
    if (n == 0) return;
    const bool copy = s.length % page_size() != 0 && ref_counts_[static_cast<std::size_t>(s.pages.back())] > 1;
    const index_t new_pages = pages_for(s.length + n) - static_cast<index_t>(s.pages.size());
    if (new_pages + copy > free_pages()) throw out_of_pages(new_pages + copy, free_pages());
    s.pages.reserve(s.pages.size() + static_cast<std::size_t>(new_pages));  // the last call that may throw
    if (copy) s.pages.back() = copy_of(s.pages.back());
    for (index_t i = 0; i < new_pages; ++i) s.pages.push_back(take_page());
    s.length += n;
  }

  /// Writes k_new [n, heads_kv, head_dim] and v_new [n, heads_kv, head_dim_v] into positions
  /// [position0, position0 + n) of the sequence in `layer`; they must be below length() and in
  /// pages the sequence holds alone. Rows hold T (float, bf16 or fp16 for an 8-bit cache,
  /// which quantizes them); const or not. With rotary tables (RotaryOptions), each K row is
  /// written rotated at its position in the sequence (position0 + i), before an 8-bit cache
  /// quantizes it; V as it is.
  void write(index_t layer, SequenceId sequence, index_t position0, StridedView<const T, 3> k_new,
             StridedView<const T, 3> v_new, const RotaryOptions& rotary = {})
    requires(!converts)
  {
    write_rows(layer, sequence, position0, k_new, v_new, rotary);
  }
  template <class RowK, class RowV>  // an 8-bit cache's rows, or rows of the wrong type (one clear error)
  void write(index_t layer, SequenceId sequence, index_t position0, const StridedView<RowK, 3>& k_new,
             const StridedView<RowV, 3>& v_new, const RotaryOptions& rotary = {})
    requires(converts || !takes_rows<RowK, RowV>)
  {
    check_row_types<RowK, RowV>();
    if constexpr (takes_rows<RowK, RowV>) {
      using S = std::remove_const_t<RowK>;
      write_rows(layer, sequence, position0, StridedView<const S, 3>(k_new), StridedView<const S, 3>(v_new),
                 rotary);
    }
  }

  /// write() of the last n = k_new.shape[0] positions: the ones extend(sequence, n) reserved.
  void write(index_t layer, SequenceId sequence, StridedView<const T, 3> k_new, StridedView<const T, 3> v_new,
             const RotaryOptions& rotary = {})
    requires(!converts)
  {
    write(layer, sequence, length(sequence) - k_new.shape[0], k_new, v_new, rotary);
  }
  template <class RowK, class RowV>
  void write(index_t layer, SequenceId sequence, const StridedView<RowK, 3>& k_new, const StridedView<RowV, 3>& v_new,
             const RotaryOptions& rotary = {})
    requires(converts || !takes_rows<RowK, RowV>)
  {
    check_row_types<RowK, RowV>();
    if constexpr (takes_rows<RowK, RowV>)
      write(layer, sequence, length(sequence) - k_new.shape[0], k_new, v_new, rotary);
  }

 private:
  template <class S>
  void write_rows(index_t layer, SequenceId sequence, index_t position0, StridedView<const S, 3> k_new,
                  StridedView<const S, 3> v_new, const RotaryOptions& rotary) {
    check_layer(layer);
    require_not_latent("v_new");
    check_new_rows(k_new, v_new, detail::new_k_dims, detail::new_v_dims, detail::tokens_may_be_empty);
    const std::vector<std::int64_t> slots = slots_of(sequence, position0, k_new.shape[0]);
    write_kv_rows(layer, slots, position0, k_new.shape[0], k_new, v_new, rotary);
  }

  void require_not_latent(const char* name) const {
    TILEATTN_REQUIRE(!config_.latent, name,
                     "a latent cache (KvCacheConfig::latent) has no V rows: write its rows with write_latent / "
                     "append_latent");
  }

  /// V of a latent cache: the K pool's first head_dim_v columns.
  template <class U>
  PagePoolView<U> latent_values(PagePoolView<U> k) const {
    k.shape[3] = config_.head_dim_v;
    return k;
  }

  /// The latent rows of write_latent: layer `layer`'s K pool only (an 8-bit cache quantizes
  /// them at K's scales, int8 growing them as write_kv_slots does).
  template <class S>
  void write_latent_rows(index_t layer, SequenceId sequence, index_t position0, StridedView<const S, 3> rows) {
    check_layer(layer);
    TILEATTN_REQUIRE(config_.latent, "latent_new", "needs a latent cache (KvCacheConfig::latent); use write");
    check_latent_rows(rows);
    const std::vector<std::int64_t> slots = slots_of(sequence, position0, rows.shape[0]);
    const PagePoolView<T> pool = k_pages(layer);
    std::vector<float> x(static_cast<std::size_t>(config_.head_dim));
    for (index_t token = 0; token < rows.shape[0]; ++token) {
      const std::int64_t slot = slots[static_cast<std::size_t>(token)];
      const index_t page = slot / page_size(), row = slot % page_size();
      if constexpr (quantized)
        detail::quantize_token(rows, token, pool, scales_view(k_scales_, layer), page, row, RotaryOptions{}, 0,
                               x.data());
      else if constexpr (!blocks)  // (a 4-bit cache is never latent: the check above threw)
        detail::copy_token(rows, token, pool, page, row);
    }
  }

  /// Views, extents and memory of latent rows [num_tokens, heads_kv, head_dim].
  template <class S>
  void check_latent_rows(const StridedView<const S, 3>& rows) const {
    detail::check_view(rows, "latent_new", detail::new_k_dims, detail::tokens_may_be_empty);
    require_extent(rows, "latent_new", 1, "heads_kv", config_.heads_kv);
    require_extent(rows, "latent_new", 2, "head_dim", config_.head_dim);
    for (index_t l = 0; l < num_layers(); ++l)
      TILEATTN_REQUIRE(!detail::byte_span(k_pages(l)).overlaps(detail::byte_span(rows)), "latent_new",
                       "overlaps the cache's pages");
  }

  /// The slots of positions [position0, position0 + n) of `sequence`: within its length and
  /// in pages it holds alone.
  std::vector<std::int64_t> slots_of(SequenceId sequence, index_t position0, index_t n) const {
    const Sequence& s = at(sequence);
    TILEATTN_REQUIRE(position0 >= 0 && position0 <= s.length - n, "position0",  // (position0 + n may overflow)
                    std::to_string(position0) + " with " + std::to_string(n) +
                        " rows: they are not within the sequence's length " + std::to_string(s.length));
    std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      const std::int32_t page = s.pages[static_cast<std::size_t>((position0 + i) / page_size())];
      const index_t holders = ref_counts_[static_cast<std::size_t>(page)];
      if (holders != 1)
        throw invalid_argument("position0", "position " + std::to_string(position0 + i) + " lies in page " +
                                                std::to_string(page) + ", shared by " + std::to_string(holders) +
                                                " sequences (only extend writes there)");
      slots[static_cast<std::size_t>(i)] = page * page_size() + (position0 + i) % page_size();
    }
    return slots;
  }

  template <class S>
  void write_kv_rows(index_t layer, const std::vector<std::int64_t>& slots, index_t position0, index_t n,
                     StridedView<const S, 3> k_new, StridedView<const S, 3> v_new, const RotaryOptions& rotary) {
    std::vector<std::int64_t> positions(rotary.enabled() ? static_cast<std::size_t>(n) : 0);
    for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = position0 + static_cast<index_t>(i);
    if constexpr (blocks) {
      write_kv_slots(k_new, v_new, k_pages(layer), v_pages(layer), slots, rotary, positions);
    } else if constexpr (quantized) {
      write_kv_slots(k_new, v_new, k_pages(layer), v_pages(layer), slots, scales_view(k_scales_, layer),
                     scales_view(v_scales_, layer), rotary, positions);
    } else {
      write_kv_slots(k_new, v_new, k_pages(layer), v_pages(layer), slots, rotary, positions);
    }
  }

  /// append's rotary checks, before it extends: the tables against head_dim, the new
  /// positions [position0, position0 + n) within them, and the tables apart from every
  /// layer's pools and scales (write_kv_slots checks one layer's, after earlier layers wrote).
  void check_append_rotary(const RotaryOptions& rotary, index_t position0, index_t n) const {
    if (!rotary.enabled()) return;
    detail::check_rotary_tables(rotary, config_.head_dim);
    if (n > 0)
      detail::check_rotary_positions(rotary, position0, position0 + n - 1,
                                     [&] { return "the " + std::to_string(n) + " appended tokens"; });
    for (index_t l = 0; l < num_layers(); ++l) {
      detail::check_disjoint_from_tables(rotary, k_pages(l), "k_cache");
      detail::check_disjoint_from_tables(rotary, v_pages(l), "v_cache");
      if constexpr (quantized) {
        detail::check_disjoint_from_tables(rotary, scales_view(k_scales_, l), "k_scale");
        detail::check_disjoint_from_tables(rotary, scales_view(v_scales_, l), "v_scale");
      }
    }
  }


 public:

  /// The free pages extend(sequence, n) would take (a copy-on-write copy included), so a
  /// scheduler can check a whole batch before it extends any sequence.
  index_t pages_needed(SequenceId sequence, index_t n) const {
    const Sequence& s = at(sequence);
    if (n <= 0) return 0;
    const bool copy = s.length % page_size() != 0 && ref_counts_[static_cast<std::size_t>(s.pages.back())] > 1;
    return pages_for(s.length + n) - static_cast<index_t>(s.pages.size()) + copy;
  }

  /// Extends by n and writes every layer: k_new [num_layers, n, heads_kv, head_dim], v_new
  /// [num_layers, n, heads_kv, head_dim_v], K rotated at the new positions when `rotary` has
  /// tables (as write). All or nothing.
  void append(SequenceId sequence, TensorView<const T> k_new, TensorView<const T> v_new,
              const RotaryOptions& rotary = {})
    requires(!converts)
  {
    append_rows(sequence, k_new, v_new, rotary);
  }
  template <class RowK, class RowV>
  void append(SequenceId sequence, const TensorView<RowK>& k_new, const TensorView<RowV>& v_new,
              const RotaryOptions& rotary = {})
    requires(converts || !takes_rows<RowK, RowV>)
  {
    check_row_types<RowK, RowV>();
    if constexpr (takes_rows<RowK, RowV>) {
      using S = std::remove_const_t<RowK>;
      append_rows(sequence, TensorView<const S>(k_new), TensorView<const S>(v_new), rotary);
    }
  }

 private:
  template <class S>
  void append_rows(SequenceId sequence, TensorView<const S> k_new, TensorView<const S> v_new,
                   const RotaryOptions& rotary) {
    const index_t position0 = at(sequence).length;
    require_not_latent("v_new");
    check_new_rows(k_new, v_new, {"num_layers", "num_tokens", "heads_kv", "head_dim"},
                   {"num_layers", "num_tokens", "heads_kv", "head_dim_v"}, {false, true, false, false});
    for (const auto& [view, name] : {std::pair{k_new, "k_new"}, std::pair{v_new, "v_new"}})
      require_extent(view, name, 0, "num_layers", num_layers());
    check_append_rotary(rotary, position0, k_new.shape[1]);
    extend(sequence, k_new.shape[1]);  // the checks above are write()'s: nothing below throws
    for (index_t l = 0; l < num_layers(); ++l)
      write_rows(l, sequence, position0, layer_rows(k_new, l), layer_rows(v_new, l), rotary);
  }

 public:

  /// A latent cache's (KvCacheConfig::latent) write(): latent_new [n, heads_kv, head_dim]
  /// into positions [position0, position0 + n) of the sequence in `layer` (below length(), in
  /// pages it holds alone); rows of T, or float, bf16 or fp16 for an 8-bit cache, which
  /// quantizes them at k_scales(). No rotary option: MLA's rotary dims are the row's last ones,
  /// rotated by the caller.
  template <class Row>
  void write_latent(index_t layer, SequenceId sequence, index_t position0, const StridedView<Row, 3>& latent_new) {
    check_row_types<Row, Row>();
    if constexpr (takes_rows<Row, Row>)
      write_latent_rows(layer, sequence, position0, StridedView<const std::remove_const_t<Row>, 3>(latent_new));
  }
  /// write_latent() of the last n = latent_new.shape[0] positions (those extend reserved).
  template <class Row>
  void write_latent(index_t layer, SequenceId sequence, const StridedView<Row, 3>& latent_new) {
    write_latent(layer, sequence, length(sequence) - latent_new.shape[0], latent_new);
  }
  /// Extends by n and writes every layer's latent rows: latent_new [num_layers, n, heads_kv,
  /// head_dim]. All or nothing.
  template <class Row>
  void append_latent(SequenceId sequence, const TensorView<Row>& latent_new) {
    check_row_types<Row, Row>();
    if constexpr (takes_rows<Row, Row>) {
      using S = std::remove_const_t<Row>;
      const TensorView<const S> rows = latent_new;
      const index_t position0 = at(sequence).length;
      TILEATTN_REQUIRE(config_.latent, "latent_new", "needs a latent cache (KvCacheConfig::latent); use append");
      detail::check_view(rows, "latent_new", {"num_layers", "num_tokens", "heads_kv", "head_dim"},
                         {false, true, false, false});
      require_extent(rows, "latent_new", 0, "num_layers", num_layers());
      for (index_t l = 0; l < num_layers(); ++l) check_latent_rows(layer_rows(rows, l));
      extend(sequence, rows.shape[1]);  // the checks above are write_latent's: nothing below throws
      for (index_t l = 0; l < num_layers(); ++l) write_latent_rows(l, sequence, position0, layer_rows(rows, l));
    }
  }

  /// Rolls back to new_length tokens: pages past it lose a reference (freed at 0).
  void truncate(SequenceId sequence, index_t new_length) {
    Sequence& s = at(sequence);
    require_in(new_length >= 0 && new_length <= s.length, "new_length",
               "[0, length = " + std::to_string(s.length) + "]", new_length);
    const auto keep = static_cast<std::size_t>(pages_for(new_length));
    for (std::size_t i = keep; i < s.pages.size(); ++i) release(s.pages[i]);
    s.pages.resize(keep);
    s.length = new_length;
  }

  /// Releases every page of the sequence; its id becomes invalid.
  void free(SequenceId sequence) {
    truncate(sequence, 0);
    sequences_.erase(sequence);
  }

  /// The block tables and lengths of `sequences`, in that order.
  BatchTables batch(std::span<const SequenceId> sequences) const {
    BatchTables t;
    for (std::size_t b = 0; b < sequences.size(); ++b) {
      const Sequence& s = at(sequences[b], "sequences[" + std::to_string(b) + "]");
      t.max_pages = std::max(t.max_pages, static_cast<index_t>(s.pages.size()));
    }
    t.block_table.assign(sequences.size() * static_cast<std::size_t>(t.max_pages), 0);
    for (std::size_t b = 0; b < sequences.size(); ++b) {
      const Sequence& s = at(sequences[b]);
      std::copy(s.pages.begin(), s.pages.end(), t.block_table.begin() + static_cast<index_t>(b) * t.max_pages);
      t.cache_seqlens.push_back(static_cast<std::int32_t>(s.length));
    }
    return t;
  }

  index_t length(SequenceId sequence) const { return at(sequence).length; }
  std::span<const std::int32_t> pages(SequenceId sequence) const& { return at(sequence).pages; }
  bool contains(SequenceId sequence) const { return sequences_.count(sequence) != 0; }

  PagePoolView<T> k_pages(index_t layer) & { return pool_view(k_pools_, layer, config_.head_dim); }
  PagePoolView<T> v_pages(index_t layer) & {
    return config_.latent ? latent_values(k_pages(layer)) : pool_view(v_pools_, layer, config_.head_dim_v);
  }
  PagePoolView<const T> k_pages(index_t layer) const& { return pool_view(k_pools_, layer, config_.head_dim); }
  PagePoolView<const T> v_pages(index_t layer) const& {
    return config_.latent ? latent_values(k_pages(layer)) : pool_view(v_pools_, layer, config_.head_dim_v);
  }

  /// An 8-bit cache's scales of `layer`, as forward_paged's options.k_scale / v_scale take
  /// them: [num_pages, heads_kv] (int8) or [1, heads_kv] (fp8, per K/V head).
  KvScaleView k_scales(index_t layer) const&
    requires quantized
  {
    return scales_view(k_scales_, layer);
  }
  KvScaleView v_scales(index_t layer) const&
    requires quantized
  {
    return scales_view(config_.latent ? k_scales_ : v_scales_, layer);
  }

  // Views of a temporary cache would dangle (as views of a temporary Eigen tensor, eigen.hpp).
  void pages(SequenceId) const&& = delete;
  void k_pages(index_t) const&& = delete;
  void v_pages(index_t) const&& = delete;
  void k_scales(index_t) const&& = delete;
  void v_scales(index_t) const&& = delete;

  const KvCacheConfig& config() const { return config_; }  // head_dim_v and layout filled in
  index_t num_layers() const { return config_.num_layers; }
  index_t num_pages() const { return config_.num_pages; }
  index_t page_size() const { return config_.page_size; }
  index_t free_pages() const { return static_cast<index_t>(free_list_.size()); }
  index_t num_sequences() const { return static_cast<index_t>(sequences_.size()); }
  index_t ref_count(std::int32_t page) const {
    require_in(page >= 0 && page < num_pages(), "page", "[0, num_pages = " + std::to_string(num_pages()) + ")",
               page);
    return ref_counts_[static_cast<std::size_t>(page)];
  }

 private:
  struct Sequence {
    std::vector<std::int32_t> pages;
    index_t length = 0;
  };
  using FreeList = std::priority_queue<std::int32_t, std::vector<std::int32_t>, std::greater<>>;

  template <class RowK, class RowV>
  static constexpr void check_row_types() {
    static_assert(takes_rows<RowK, RowV>,
                  "tileattn: KvCache<T>::write and append take k_new and v_new rows of the cache's element type T "
                  "(an 8-bit cache: float, bf16 or fp16 rows), the same element type for both");
  }

  /// fp8: layer l's per-head scales from the config's k_scale or v_scale.
  std::vector<float> layer_scales(const std::vector<float>& given, index_t l) const {
    const auto heads = static_cast<std::size_t>(config_.heads_kv);
    if (given.empty()) return std::vector<float>(heads, 1.0f);
    if (given.size() == 1) return std::vector<float>(heads, given[0]);
    if (given.size() == heads) return given;
    return {given.begin() + static_cast<std::ptrdiff_t>(l * config_.heads_kv),
            given.begin() + static_cast<std::ptrdiff_t>((l + 1) * config_.heads_kv)};
  }

  /// Layer `layer`'s scales: [num_pages, heads_kv] (int8) or [1, heads_kv] broadcast (fp8).
  KvScaleView scales_view(const std::vector<std::vector<float>>& scales, index_t layer) const {
    const PageScaleView v = scales_view(const_cast<std::vector<std::vector<float>>&>(scales), layer);
    return {v.data, v.shape, v.stride};
  }
  PageScaleView scales_view(std::vector<std::vector<float>>& scales, index_t layer) const {
    check_layer(layer);
    float* s = scales[static_cast<std::size_t>(layer)].data();
    if constexpr (adaptive_scale<T>) return {s, {num_pages(), config_.heads_kv}, {config_.heads_kv, 1}};
    else return {s, {1, config_.heads_kv}, {0, 1}};
  }

  static void check_scales(const KvCacheConfig& c) {
    for (const auto& [given, name] : {std::pair{&c.k_scale, "k_scale"}, std::pair{&c.v_scale, "v_scale"}}) {
      if (!quantized || adaptive_scale<T>) {
        TILEATTN_REQUIRE(given->empty(), name,
                         std::string("is for fp8 caches only (") + kv_type_name<T>() +
                             (adaptive_scale<T> ? " keeps a scale per page, set as values arrive)" : " has no scales)"));
        continue;
      }
      const auto n = static_cast<index_t>(given->size());
      const bool per_layer = n % c.heads_kv == 0 && n / c.heads_kv == c.num_layers;  // num_layers x heads_kv
      TILEATTN_REQUIRE(n <= 1 || n == c.heads_kv || per_layer, name,
                       "needs 0, 1, heads_kv = " + std::to_string(c.heads_kv) + " or num_layers x heads_kv = " +
                           std::to_string(c.num_layers) + " x " + std::to_string(c.heads_kv) + " values, got " +
                           std::to_string(n));
      for (std::size_t i = 0; i < given->size(); ++i)
        TILEATTN_REQUIRE(std::isfinite((*given)[i]) && (*given)[i] > 0.0f, name,
                         "entry " + std::to_string(i) + " = " + std::to_string((*given)[i]) + " must be finite and > 0");
    }
  }

  static KvCacheConfig checked(KvCacheConfig c) {
    if (c.head_dim_v == 0) c.head_dim_v = c.head_dim;
    for (const auto& [value, name] : {std::pair{c.num_layers, "num_layers"}, std::pair{c.num_pages, "num_pages"},
                                      std::pair{c.page_size, "page_size"}, std::pair{c.heads_kv, "heads_kv"},
                                      std::pair{c.head_dim, "head_dim"}, std::pair{c.head_dim_v, "head_dim_v"}})
      TILEATTN_REQUIRE(value >= 1, name, "must be >= 1, got " + std::to_string(value));
    TILEATTN_REQUIRE(c.num_pages <= max_length, "num_pages",
                    "must fit int32 (block tables hold page ids), got " + std::to_string(c.num_pages));
    TILEATTN_REQUIRE(c.layout == PageLayout::automatic || c.layout == PageLayout::token_major ||
                         c.layout == PageLayout::head_major,
                     "layout", "must be PageLayout::automatic, token_major or head_major, got " +
                                   std::to_string(static_cast<int>(c.layout)));
    for (const auto& [value, name] : {std::pair{c.head_dim, "head_dim"}, std::pair{c.head_dim_v, "head_dim_v"}})
      TILEATTN_REQUIRE(value % values_per_row_element == 0, name,
                       std::string("must be a multiple of ") + kv_type_name<T>() + "'s block of " +
                           std::to_string(values_per_row_element) + " values, got " + std::to_string(value));
    if constexpr (is_hadamard_rotated<T>)
      for (const auto& [value, name] : {std::pair{c.head_dim, "head_dim"}, std::pair{c.head_dim_v, "head_dim_v"}})
        TILEATTN_REQUIRE(ops::hadamard_length(value), name,
                         std::string("must be a power of two for a ") + kv_type_name<T>() + " cache, got " +
                             std::to_string(value));
    c.layout = resolved_layout<T>(c.layout);
    if (c.latent) {
      TILEATTN_REQUIRE(!blocks, "latent",
                       std::string("is not supported for 4-bit caches yet (forward_paged_mla takes none); this one holds ") +
                           kv_type_name<T>());
      TILEATTN_REQUIRE(c.head_dim_v <= c.head_dim, "head_dim_v",
                       "of a latent cache (V: the latent's first columns) must be <= head_dim = " +
                           std::to_string(c.head_dim) + ", got " + std::to_string(c.head_dim_v));
      TILEATTN_REQUIRE(c.v_scale.empty(), "v_scale", "must be empty for a latent cache: k_scale scales V too");
    }
    const detail::CheckedSum layer = layer_bytes(c);
    TILEATTN_REQUIRE(layer.at_most(max_allocation_bytes), "num_pages",
                     "num_pages x page_size x heads_kv x (head_dim + head_dim_v) elements of " +
                         std::to_string(sizeof(T)) + " bytes: one layer's pools take more than max_allocation_bytes "
                         "(2^47, the address space)");
    const detail::CheckedSum total =
        detail::CheckedSum{}.add({layer.value, c.num_layers}).add({c.num_pages, page_state_bytes});
    TILEATTN_REQUIRE(total.at_most(max_allocation_bytes), "num_layers",
                     std::to_string(c.num_layers) + " layers of " + std::to_string(layer.value) +
                         " bytes take more than max_allocation_bytes (2^47, the address space)");
    check_scales(c);  // after the bounds: num_layers x heads_kv fits
    return c;
  }

  /// Bytes per page beside the pools: a reference count and a free-list entry.
  static constexpr index_t page_state_bytes = sizeof(index_t) + sizeof(std::int32_t);

  /// Bytes one layer allocates: its K and V pools (each up to a cache line more, as
  /// LineAlignedAllocator aligns them), an 8-bit cache's scales, and the vectors that hold them.
  static detail::CheckedSum layer_bytes(const KvCacheConfig& c) {
    const auto size = static_cast<index_t>(sizeof(T));
    const index_t vectors = 2 * static_cast<index_t>(cache_line_bytes + sizeof(Pool) + sizeof(std::vector<float>));
    const index_t scale_rows = !quantized ? 0 : adaptive_scale<T> ? c.num_pages : 1;  // per layer, K and V each
    return detail::CheckedSum{}
        .add({c.num_pages, c.page_size, c.heads_kv, c.head_dim / values_per_row_element, size})
        .add({c.num_pages, c.page_size, c.heads_kv, c.latent ? 0 : c.head_dim_v / values_per_row_element, size})
        .add({2, scale_rows, c.heads_kv, static_cast<index_t>(sizeof(float))})
        .add({vectors});
  }

  index_t pages_for(index_t tokens) const { return tokens / page_size() + (tokens % page_size() != 0); }

  SequenceId add(Sequence s) {
    sequences_.emplace(next_id_, std::move(s));
    return next_id_++;
  }
  const Sequence& at(SequenceId id, const std::string& name = "sequence") const {
    const auto it = sequences_.find(id);
    if (it == sequences_.end())
      throw invalid_argument(name, "unknown sequence id " + std::to_string(id) + " (never created, or freed)");
    return it->second;
  }
  Sequence& at(SequenceId id) { return const_cast<Sequence&>(std::as_const(*this).at(id)); }

  void check_layer(index_t layer) const {
    require_in(layer >= 0 && layer < num_layers(), "layer",
               "[0, num_layers = " + std::to_string(num_layers()) + ")", layer);
  }
  template <class Pools>  // std::vector<std::vector<T>>, const or not
  auto pool_view(Pools& pools, index_t layer, index_t dim) const {
    check_layer(layer);
    auto& pool = pools[static_cast<std::size_t>(layer)];  // const when pools is
    return make_page_pool(pool.data(), num_pages(), page_size(), config_.heads_kv, dim / values_per_row_element,
                          config_.layout);
  }

  /// Views, extents and memory of new rows [..., num_tokens, heads_kv, head_dim(_v)].
  template <class S, int R>
  void check_new_rows(const StridedView<const S, R>& k_new, const StridedView<const S, R>& v_new,
                      const std::array<const char*, static_cast<std::size_t>(R)>& k_dims,
                      const std::array<const char*, static_cast<std::size_t>(R)>& v_dims,
                      const detail::EmptyExtents<R>& may_be_empty) const {
    detail::check_view(k_new, "k_new", k_dims, may_be_empty);
    detail::check_view(v_new, "v_new", v_dims, may_be_empty);
    detail::check_same_extent(k_new, "k_new", v_new, "v_new", R - 3, "num_tokens");
    require_extent(k_new, "k_new", R - 2, "heads_kv", config_.heads_kv);
    require_extent(k_new, "k_new", R - 1, "head_dim", config_.head_dim);
    require_extent(v_new, "v_new", R - 2, "heads_kv", config_.heads_kv);
    require_extent(v_new, "v_new", R - 1, "head_dim_v", config_.head_dim_v);
    for (index_t l = 0; l < num_layers(); ++l)
      for (const auto& pool : {k_pages(l), v_pages(l)}) {
        for (const auto& [rows, name] : {std::pair{k_new, "k_new"}, std::pair{v_new, "v_new"}})
          TILEATTN_REQUIRE(!detail::byte_span(pool).overlaps(detail::byte_span(rows)), name,
                          "overlaps the cache's pages");
      }
  }

  static void require_in(bool ok, const char* name, const std::string& range, index_t value) {
    TILEATTN_REQUIRE(ok, name, "must be in " + range + ", got " + std::to_string(value));
  }
  template <class S, int R>
  static void require_extent(const StridedView<const S, R>& view, const char* name, std::size_t d, const char* meaning,
                             index_t want) {
    TILEATTN_REQUIRE(view.shape[d] == want, detail::dim_name(name, "shape", d, meaning),
                    "must equal the cache's " + std::string(meaning) + " = " + std::to_string(want) + ", got " +
                        std::to_string(view.shape[d]));
  }

  /// Layer l's [n, heads_kv, head_dim] rows of [num_layers, n, heads_kv, head_dim].
  template <class S>
  static StridedView<const S, 3> layer_rows(const TensorView<const S>& rows, index_t l) {
    return rows.sub_view(l);
  }

  std::int32_t take_page() {
    const std::int32_t page = free_list_.top();
    free_list_.pop();
    ref_counts_[static_cast<std::size_t>(page)] = 1;
    if constexpr (adaptive_scale<T>)  // a page that holds nothing yet
      for (auto* scales : {&k_scales_, &v_scales_})
        for (auto& layer : *scales)
          std::fill_n(layer.begin() + page * config_.heads_kv, config_.heads_kv, 0.0f);
    return page;
  }
  void release(std::int32_t page) {
    if (--ref_counts_[static_cast<std::size_t>(page)] == 0) free_list_.push(page);
  }
  /// A fresh page holding a copy of `shared` (K and V, every layer); `shared` loses a reference.
  std::int32_t copy_of(std::int32_t shared) {
    const std::int32_t page = take_page();
    for (auto* pools : {&k_pools_, &v_pools_})
      for (auto& pool : *pools) {
        const auto size = static_cast<index_t>(pool.size()) / num_pages();
        std::copy_n(pool.begin() + shared * size, size, pool.begin() + page * size);
      }
    if constexpr (adaptive_scale<T>)
      for (auto* scales : {&k_scales_, &v_scales_})
        for (auto& layer : *scales)
          std::copy_n(layer.begin() + shared * config_.heads_kv, config_.heads_kv, layer.begin() + page * config_.heads_kv);
    release(shared);
    return page;
  }

  KvCacheConfig config_;
  using Pool = std::vector<T, LineAlignedAllocator<T>>;  // rows start on cache lines
  std::vector<Pool> k_pools_, v_pools_;  // per layer: [num_pages, page_size, heads_kv, head_dim(_v)]
  std::vector<std::vector<float>> k_scales_, v_scales_;  // 8-bit: per layer, [num_pages or 1, heads_kv]
  std::vector<index_t> ref_counts_;                // per page
  FreeList free_list_;                             // lowest page first
  std::unordered_map<SequenceId, Sequence> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace tileattn
