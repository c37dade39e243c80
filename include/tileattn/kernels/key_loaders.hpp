// tileattn/kernels/key_loaders.hpp: how a key tile reaches the products: the forward's
// loaders, the policies of its one key loop (kernels/forward.hpp, forward_item).
//
// A work item's loader holds the SRAM tiles of its query rows (one set per K/V head it
// attends) and, key tile by key tile, says which of its heads see the tile (select), brings
// the tile's K and V in (load), and hands each head's operands to the loop's products with
// the dequantization scales that go with them (for_each_operand). The loop calls the same
// phases in the same order whatever the loader: skip, load, products, softmax, accumulate,
// finish (kernels/forward.hpp). The contract is the concept key_tile_loader below.
//
//   PackedLoader    K^T and V copied into SRAM tiles (float, or bf16 pairs; in panels the
//                   products read directly where the micro-kernel set multiplies prepared
//                   operands: AMX), the next tile's rows prefetched; V made from K^T in
//                   SRAM where V is K's first columns (MLA's latent, ForwardParams::v_in_k).
//                   One K/V head: a query block with one head.
//   InPlaceLoader   K and V rows read where they lie (RowRefs; decode and short verify steps,
//                   QueryBlock::in_place), several K/V heads streamed in together
//                   (touch_head_rows), 4-bit blocks staged: dequantized into float rows.
//
// Where K and V live is the loaders' Kv policy (kernels/kv_source.hpp: contiguous, paged,
// gathered). The scales that go with a tile come with its operands (TileScalesRef, the
// quantization model of kernels/tile_scales.hpp: 8-bit K/V one per key; 4-bit blocks
// dequantize exactly as they load). The next issue's
// loaders (pages already in the products' operand layout, quantized codes multiplied
// without conversion) are new models of the same concept.
#pragma once

#include <algorithm>
#include <cassert>
#include <concepts>
#include <type_traits>
#include <utility>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/kv_source.hpp"
#include "tileattn/kernels/operands.hpp"
#include "tileattn/kernels/tile_lists.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/kernels/tile_scales.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/operand_layout.hpp"

namespace tileattn::kernels {

/// What a work item that reads K and V in place keeps in SRAM: Q (float, or bf16 pairs:
/// Op), float S and O, the row statistics as ForwardTiles, P as bf16 pairs where Op is, and
/// instead of K^T and V tiles the addresses of the key and value rows of the key tile
/// (storage type T, converted in registers by the float products, read as they are by the
/// pair products: with_in_place_operand says which). 4-bit blocks are staged: a key tile's
/// K and V rows are dequantized into float rows (k_values, v_values: a straight row
/// conversion, no transpose), which the float products then read in place.
template <class T, class Op = float>
struct InPlaceTiles {
  static constexpr bool pairs = std::is_same_v<Op, bf16x2>;
  static constexpr bool panels = false;  // (slab_rows_of: an item's rows are one slab)
  static constexpr bool staged = block_quantized_type<T>;
  static_assert(!pairs || std::is_same_v<T, bf16>, "pairs multiply bf16 rows only");
  using row_type = std::conditional_t<staged, float, T>;
  Tile<Op> q;
  Tile<float> s, o;
  Tile<Op> p;  // pairs only
  ops::RowStats stats;
  TileVector<float> lse;
  RowRefs<row_type> k_rows, v_rows;
  Tile<float> k_values, v_values;  // staged only

  /// The scratch pieces, in carving order: footprint() counts them and carve() carves them.
  template <class Piece>
  constexpr void pieces(Piece& piece, index_t br, index_t bc, index_t d, index_t dv) {
    piece(q, br, operand_cols<Op>(d));  // (Br, d)
    piece(s, br, bc);                   // (Br, Bc)
    if constexpr (pairs) piece(p, br, operand_cols<Op>(bc));  // (Br, Bc) in pairs
    piece(o, br, dv);  // (Br, dv)
    stats.pieces(piece, br);
    piece(lse, br);
    piece(k_rows, bc);
    piece(v_rows, bc);
    if constexpr (staged) {
      piece(k_values, bc, d);   // (Bc, d)
      piece(v_values, bc, dv);  // (Bc, dv)
    }
  }
  static constexpr std::size_t footprint(index_t br, index_t bc, index_t d, index_t dv) {
    return pieces_bytes<InPlaceTiles>(br, bc, d, dv);
  }
  /// Rows of a work item that reads in place: at most in_place_max_rows.
  static index_t rows(const TilePlan& plan) { return std::min(plan.packed_rows(), in_place_max_rows); }
  static InPlaceTiles carve(ScratchArena& arena, const TilePlan& plan, index_t d, index_t dv) {
    return carve_pieces<InPlaceTiles>(arena, rows(plan), plan.key_tile_rows, d, dv);
  }
};

/// Whether Q of T with K/V of KV may be multiplied as bf16 pairs in place: both bf16.
template <class T, class KV>
inline constexpr bool in_place_pairs_possible = std::is_same_v<T, bf16> && std::is_same_v<KV, bf16>;

/// Whether in-place items whose K/V group has `group_rows` query rows (the group's heads
/// times the sequence's new tokens) multiply bf16 pairs: where Q and K/V are bf16 and the
/// micro-kernel set multiplies pairs with rows in place from that many rows
/// (arch::native::in_place_pairs: vdpbf16ps on Zen 5, always; AMX tiles from 8 rows). Q is
/// exact as pairs; P is rounded to bf16, as the packed bf16 path rounds it. The choice
/// depends on the types, the CPU and the sequence's shape, never on the tiling or threads.
template <class T, class KV>
bool in_place_pairs_for(index_t group_rows) {
  return in_place_pairs_possible<T, KV> && arch::set_detail::value(arch::native::in_place_pairs) &&
         group_rows >= arch::set_detail::value(arch::native::in_place_pairs_min_rows);
}

/// f(std::type_identity<Op>{}) for the operand type of the Q and P of an in-place item whose
/// K/V group has `group_rows` query rows: bf16x2 where in_place_pairs_for, else float.
template <class T, class KV, class F>
decltype(auto) with_in_place_operand(index_t group_rows, F&& f) {
  if constexpr (in_place_pairs_possible<T, KV>)
    if (in_place_pairs_for<T, KV>(group_rows)) return f(std::type_identity<bf16x2>{});
  return f(std::type_identity<float>{});
}

/// The most K/V heads one in-place item takes (QueryBlock::kv_heads).
inline constexpr index_t max_kv_heads_per_item = 16;

/// The SRAM an in-place item of `heads` K/V heads carves: each head's InPlaceTiles, and
/// the interleaved row addresses of one key tile of all of them (touch_head_rows).
template <class KV, class Op = float>
std::size_t in_place_item_bytes(const TilePlan& plan, index_t d, index_t dv, index_t heads) {
  using Tiles = InPlaceTiles<KV, Op>;
  const index_t bc = plan.key_tile_rows;
  return static_cast<std::size_t>(heads) * Tiles::footprint(Tiles::rows(plan), bc, d, dv) +
         round_up_to_line(static_cast<std::size_t>(heads * bc) * sizeof(const void*));
}

/// K/V heads per work item (ForwardWorkList): for 8-bit K/V when every sequence reads K and
/// V in place, the largest divisor of heads_kv (at most max_kv_heads_per_item) whose key
/// tiles of K and V rows, with the item's tiles, take at most half the SRAM budget (the rows
/// of one key tile stay in cache between the pass that streams them in and the products);
/// else 1. Measured in one session (B 8, 4k and 16k, 2 threads): int8 14-17% faster
/// grouped, fp32 within +-3%, bf16 8-15% slower, so 16- and 32-bit K/V keep one head per item.
template <class T, class KV>
index_t in_place_heads_per_item(const ForwardParams<T, KV>& p, const TilePlan& plan) {
  if constexpr (sizeof(KV) > 1) return 1;
  for (index_t b = 0; b < p.batch(); ++b)
    if (!reads_kv_in_place(p, p.sequence(b))) return 1;
  const auto rows_bytes = static_cast<std::size_t>(plan.key_tile_rows * (p.head_dim() + p.head_dim_v())) * sizeof(KV);
  for (index_t g = std::min(p.heads_kv(), max_kv_heads_per_item); g > 1; --g)
    if (p.heads_kv() % g == 0 &&
        static_cast<std::size_t>(g) * rows_bytes + in_place_item_bytes<KV>(plan, p.head_dim(), p.head_dim_v(), g) <=
            plan.sram_budget_bytes / 2)
      return g;
  return 1;
}

/// Streams one key tile's K (or V) rows of every head of an item into cache, key by key
/// and head by head within a key: adjacent in memory, so one sequential pass per page.
template <class KV>
void touch_head_rows(const RowRefs<KV>* rows, index_t heads, const void** order) {
  const index_t cols = rows[0].rows();
  for (index_t r = 0; r < cols; ++r)
    for (index_t h = 0; h < heads; ++h) order[r * heads + h] = rows[h].row(r);
  arch::native::touch_rows(order, cols * heads, rows[0].cols() * static_cast<index_t>(sizeof(KV)));
}

/// refs[r] = the address of tile row r, r in [0, tile.rows()).
inline void point_at_rows(RowRefs<float>& refs, const Tile<float>& tile) {
  refs.set_extent(tile.rows(), tile.cols());
  for (index_t r = 0; r < tile.rows(); ++r) refs.row_ref(r) = tile.row(r);
}

/// One key tile's K and V rows of an in-place item: their addresses, or, for 4-bit blocks,
/// their values dequantized into the staging rows and those rows' addresses. v_in_k (MLA's
/// latent): V's rows are K's, their first dv columns, never read a second time.
template <class KV, class Op, class Src, class Io>
void load_key_tile_rows(InPlaceTiles<KV, Op>& t, const Src& k, const Src& v, bool v_in_k, index_t dv, index_t col0,
                        index_t cols, Io& io) {
  if constexpr (InPlaceTiles<KV, Op>::staged) {
    load_rows(t.k_values, k, col0, cols, io);  // (Bc, d), dequantized
    point_at_rows(t.k_rows, t.k_values);
    if (v_in_k) return value_refs_from_keys(t.v_rows, t.k_rows, dv);
    load_rows(t.v_values, v, col0, cols, io);  // (Bc, dv)
    point_at_rows(t.v_rows, t.v_values);
  } else {
    load_row_refs(t.k_rows, k, col0, cols, io);  // (Bc) key rows
    if (v_in_k) value_refs_from_keys(t.v_rows, t.k_rows, dv);  // MLA: the same rows
    else load_row_refs(t.v_rows, v, col0, cols, io);  // (Bc) value rows
  }
}

/// What the key loop asks of a loader L (file comment) for an item whose score modifiers are
/// Mods, counting traffic in Io: for_each_head(f) calls f(tiles, head's QueryBlock) for each
/// K/V head's tiles (the loop starts and finishes them); select(mods, col0, cols) says whether
/// any head's rows see keys [col0, col0 + cols) (false: the tile is skipped, never loaded);
/// load(col0, cols, key_end, io) brings the tile in; for_each_operand(col0, cols, io, f)
/// calls f(tiles, K operand, V operand, TileScalesRef, rows) for each head that sees it.
struct OperandSink {
  template <class... A>
  void operator()(A&&...) const {}
};
template <class L, class Mods, class Io>
concept key_tile_loader = requires(L& l, const Mods& mods, index_t i, Io& io) {
  l.for_each_head(OperandSink{});
  { l.select(mods, i, i) } -> std::same_as<bool>;
  l.load(i, i, i, io);
  l.for_each_operand(i, i, io, OperandSink{});
};

/// The packed loader (file comment): an item's rows against K^T and V tiles in SRAM.
/// Holds the item's AMX tile configuration (ops::ProductScope) while it lives.
template <class Kv, class T, class KV, class Op>
class PackedLoader {
 public:
  using Src = source_matrix_t<Kv, T, KV>;

  PackedLoader(const ForwardParams<T, KV>& p, const QueryBlock& blk, ForwardTiles<Op>& t)
      : blk_(blk), t_(t), k_(Kv::matrix(p, p.k, blk)), v_(Kv::matrix(p, p.v, blk)), v_in_k_(p.v_in_k),
        scales_(item_scales<Kv>(p, blk)) {}
  PackedLoader(const PackedLoader&) = delete;
  PackedLoader& operator=(const PackedLoader&) = delete;

  template <class F>
  void for_each_head(F&& f) { f(t_, blk_); }

  /// Tiles the modifiers skip whole (a block mask's empty blocks) are never loaded.
  template <class Mods>
  bool select(const Mods& mods, index_t col0, index_t cols) const { return !mods.skips(blk_.rows, col0, cols); }

  /// K^T and V (or V from K^T, in SRAM: the latent is read once per key tile), the tile's
  /// 8-bit scales, and a prefetch of the next tile's rows.
  template <class Io>
  void load(index_t col0, index_t cols, index_t key_end, Io& io) {
    load_rows_transposed(t_.k_t, k_, col0, cols, io);                // (d, Bc)
    if (v_in_k_) ops::values_from_keys(t_.v, t_.k_t, v_.cols);       // (Bc, dv) from K^T, in SRAM
    else load_rows_pairwise(t_.v, v_, col0, cols, io);               // (Bc, dv)
    tile_scales_ = scales_.load(col0, cols, io);                     // 8-bit K/V: (Bc) each
    if (const index_t next = col0 + cols; next < key_end) {  // (docs/performance.md: its measured effect)
      prefetch_rows(k_, next, std::min(cols, key_end - next));
      if (!v_in_k_) prefetch_rows(v_, next, std::min(cols, key_end - next));
    }
  }

  /// The tile's operands: in panels, K^T and V as the products read them, prepared once for
  /// all slabs; else the tiles themselves.
  template <class Io, class F>
  void for_each_operand(index_t, index_t, Io&, F&& f) {
    if constexpr (ForwardTiles<Op>::pairs) {
      if (t_.panels) {
        f(t_, ops::prepare_operand(t_.k_t, t_.k_packed.data()), ops::prepare_operand(t_.v, t_.v_packed.data()),
          std::as_const(tile_scales_), blk_.rows);
        return;
      }
    }
    f(t_, std::as_const(t_.k_t), std::as_const(t_.v), std::as_const(tile_scales_), blk_.rows);
  }

 private:
  const QueryBlock& blk_;
  ForwardTiles<Op>& t_;
  Src k_, v_;
  bool v_in_k_;
  std::conditional_t<quantized_type<KV>, TileScales, NoTileScales> scales_;
  TileScalesRef tile_scales_{};
  [[maybe_unused]] ops::ProductScope products_;  // (AMX: one tile configuration for the item)
};

/// The in-place loader (file comment): an item of blk.kv_heads K/V heads, each with the
/// InPlaceTiles of its query rows; key tile by key tile, the rows of every head that sees it
/// streamed in together, then each head's products on them. Each head computes exactly what
/// an item of its own would: the results are the same bits for any kv_heads.
template <class Kv, class T, class KV, class Op = float>
class InPlaceLoader {
 public:
  using Src = source_matrix_t<Kv, T, KV>;
  using Tiles = InPlaceTiles<KV, Op>;
  using Rows = typename Tiles::row_type;

  InPlaceLoader(const ForwardParams<T, KV>& p, const TilePlan& plan, const QueryBlock& blk, ScratchArena& arena)
      : p_(p), n_(blk.kv_heads) {
    assert(n_ >= 1 && n_ <= max_kv_heads_per_item);
    for (index_t h = 0; h < n_; ++h) {
      head_blk_[h] = blk;
      head_blk_[h].kv_head = blk.kv_head + h;
      head_blk_[h].rows.head0 = blk.rows.head0 + h * p.group_size();
      head_blk_[h].kv_heads = 1;
      t_[h] = Tiles::carve(arena, plan, p.head_dim(), p.head_dim_v());
      k_[h] = Kv::matrix(p, p.k, head_blk_[h]);
      v_[h] = Kv::matrix(p, p.v, head_blk_[h]);
    }
    order_ = arena.carve<const void*>(static_cast<std::size_t>(n_ * plan.key_tile_rows));
  }
  InPlaceLoader(const InPlaceLoader&) = delete;
  InPlaceLoader& operator=(const InPlaceLoader&) = delete;

  template <class F>
  void for_each_head(F&& f) {
    for (index_t h = 0; h < n_; ++h) f(t_[h], std::as_const(head_blk_[h]));
  }

  /// The heads whose rows see the tile (a block mask may skip it for some).
  template <class Mods>
  bool select(const Mods& mods, index_t col0, index_t cols) {
    active_ = 0;
    for (index_t h = 0; h < n_; ++h)
      if (!mods.skips(head_blk_[h].rows, col0, cols)) heads_[active_++] = h;
    return active_ > 0;
  }

  /// Every active head's key and value rows (their addresses, or 4-bit rows staged), then
  /// all of them streamed into cache together, key by key (touch_head_rows).
  template <class Io>
  void load(index_t col0, index_t cols, index_t, Io& io) {
    for (index_t a = 0; a < active_; ++a) {
      const index_t h = heads_[a];
      load_key_tile_rows(t_[h], k_[h], v_[h], p_.v_in_k, p_.head_dim_v(), col0, cols, io);  // (Bc) key and value rows
      k_rows_[a] = t_[h].k_rows;
      v_rows_[a] = t_[h].v_rows;
    }
    if constexpr (!Tiles::staged) {  // (staged rows were just written: in cache)
      touch_head_rows(k_rows_, active_, order_);  // (a software prefetch of the next tile's rows
      if (!p_.v_in_k) touch_head_rows(v_rows_, active_, order_);  // here gained nothing: docs/paged.md)
    }
  }

  /// Each active head's key and value rows with the tile's 8-bit scales.
  template <class Io, class F>
  void for_each_operand(index_t col0, index_t cols, Io& io, F&& f) {
    for (index_t a = 0; a < active_; ++a) {
      const index_t h = heads_[a];
      auto scales = item_scales<Kv>(p_, head_blk_[h]);
      const TileScalesRef tile_scales = scales.load(col0, cols, io);
      f(t_[h], std::as_const(t_[h].k_rows), std::as_const(t_[h].v_rows), tile_scales, head_blk_[h].rows);
    }
  }

 private:
  const ForwardParams<T, KV>& p_;
  index_t n_;
  QueryBlock head_blk_[max_kv_heads_per_item];
  Tiles t_[max_kv_heads_per_item];
  Src k_[max_kv_heads_per_item], v_[max_kv_heads_per_item];
  RowRefs<Rows> k_rows_[max_kv_heads_per_item], v_rows_[max_kv_heads_per_item];
  const void** order_ = nullptr;
  index_t heads_[max_kv_heads_per_item];  // the heads that see the current tile
  index_t active_ = 0;
  struct NoScope {};
  // (AMX: one tile configuration for the item's pair products)
  [[no_unique_address]] std::conditional_t<Tiles::pairs, ops::ProductScope, NoScope> products_;
};

}  // namespace tileattn::kernels
