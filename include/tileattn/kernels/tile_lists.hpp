// tileattn/kernels/tile_lists.hpp: what a forward or backward work item keeps in SRAM, each
// kernel's tiles listed once (a `pieces` member, memory/scratch_arena.hpp): the planners
// count their bytes from that list (kernels/tile_plan.hpp, kernels/backward_plan.hpp) and
// the kernels carve them from it, so that the working set planned is the one carved.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "tileattn/arch/prepared_pairs.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::kernels {

/// The most rows of a slab (ops on bf16 panels, kernels/tile_plan.hpp's TileOperands): S and
/// P hold this many rows there.
inline constexpr index_t max_slab_rows = 64;

/// Operand columns that hold n values (pairs hold two).
template <class Op>
constexpr index_t operand_cols(index_t n) {
  return std::is_same_v<Op, bf16x2> ? (n + 1) / 2 : n;
}

/// Everything one forward work item keeps in SRAM. Footprint: forward_working_set_bytes
/// (kernels/tile_plan.hpp), counted from the same list as the carve.
/// Op is float or bf16x2 (tile_operand_t); S and O accumulate in float either way.
template <class Op>
struct ForwardTiles {
  static constexpr bool pairs = std::is_same_v<Op, bf16x2>;
  Tile<Op> q;             // (Br, d) packed queries
  Tile<Op> k_t;           // (d, Bc) keys, transposed
  Tile<Op> v;             // (Bc, dv) values
  Tile<float> s;          // (Br, Bc) scores, then probabilities
  Tile<Op> p;             // (Br, Bc) probabilities rounded for P V (bf16 pairs only)
  Tile<float> o;          // (Br, dv) output accumulator
  ops::RowStats stats;    // (Br) running max and sum
  TileVector<float> lse;  // (Br)
  TileVector<Op> k_packed, v_packed;  // K^T and V as the products read them (panels only;
                                      // arch/prepared_pairs.hpp)
  bool panels = false;                // bf16 panels: S and P hold one slab of rows

  /// The scratch pieces, in carving order: footprint() counts them (the planner's
  /// forward_working_set_bytes) and carve() carves them.
  template <class Piece>
  constexpr void pieces(Piece& piece, index_t br, index_t bc, index_t d, index_t dv, bool in_panels = false) {
    const index_t score_rows = in_panels ? std::min(br, max_slab_rows) : br;
    piece(q, br, operand_cols<Op>(d));
    piece(k_t, operand_cols<Op>(d), bc);
    piece(v, operand_cols<Op>(bc), dv);
    piece(s, score_rows, bc);
    if constexpr (pairs) piece(p, score_rows, operand_cols<Op>(bc));
    piece(o, br, dv);
    stats.pieces(piece, br);
    piece(lse, br);
    if (pairs && in_panels) {
      piece(k_packed, arch::prepared_pairs_capacity(operand_cols<Op>(d), bc));
      piece(v_packed, arch::prepared_pairs_capacity(operand_cols<Op>(bc), dv));
    }
  }
  static constexpr std::size_t footprint(index_t br, index_t bc, index_t d, index_t dv, bool in_panels = false) {
    return pieces_bytes<ForwardTiles>(br, bc, d, dv, in_panels);
  }
  /// For br packed query rows (TilePlan::packed_rows) and bc keys, in panels or not.
  static ForwardTiles carve(ScratchArena& arena, index_t br, index_t bc, index_t d, index_t dv,
                            bool in_panels = false) {
    ForwardTiles t = carve_pieces<ForwardTiles>(arena, br, bc, d, dv, in_panels);
    t.panels = pairs && in_panels;
    return t;
  }
};

/// Everything one backward work item keeps in SRAM. Footprint: backward_working_set_bytes
/// (kernels/backward_plan.hpp), counted from the same list as the carve.
/// Op is float or bf16x2 (tile_operand_t); S, dP, dS and the dK, dV accumulators are float.
/// A float tile serves as every operand, P and dS also as the transposed A operands of P^T dO
/// and dS^T Q (the micro-kernels read A by columns: no transposed copy). With bf16 pairs,
/// tiles summed over their rows in a product are held a second time with pairs of rows
/// (k_rows, q_rows, dout_rows), and P and dS are rounded to pairs before their products, as
/// on GPUs (ops/operand_layout.hpp).
template <class Op>
struct BackwardTiles {
  static constexpr bool pairs = std::is_same_v<Op, bf16x2>;
  Tile<Op> k;          // (Bc, d) keys
  Tile<Op> k_t;        // (d, Bc) keys, transposed: S = Q K^T
  Tile<Op> k_rows;     // (Bc, d) keys, pairs of rows: dQ += dS K (pairs only)
  Tile<Op> v;          // (Bc, dv) values: staging for v_t (pairs only)
  Tile<Op> v_t;        // (dv, Bc) values, transposed: dP = dO V^T
  Tile<float> dk, dv;  // (Bc, d), (Bc, dv) accumulators
  Tile<Op> q, q_rows;        // (Br, d): S = Q K^T; pairs of rows: dK += dS^T Q (pairs only)
  Tile<Op> dout, dout_rows;  // (Br, dv): dP = dO V^T; pairs of rows: dV += P^T dO (pairs only)
  Tile<float> s;       // (Br, Bc) scores, then P
  Tile<float> ds;      // (Br, Bc) dP, then dS
  Tile<Op> p_op;       // (Br, Bc) P, then dS, rows paired: the transposed A operand (pairs only)
  Tile<Op> ds_op;      // (Br, Bc) dS as an operand (pairs only)
  Tile<float> slope;   // (Br, Bc) the modified score's derivative (softcap or a score_mod only)
  TileVector<float> lse2, lse2_low, delta;  // (Br) P's shift in log2 units (two parts: load_shift), D

  /// The scratch pieces, in carving order: footprint() counts them (the planner's
  /// backward_working_set_bytes) and carve() carves them. `slope`: the slope tile is carved.
  template <class Piece>
  constexpr void pieces(Piece& piece, index_t br, index_t bc, index_t d, index_t value_dim, bool with_slope) {
    const auto cols = [](index_t n) { return operand_cols<Op>(n); };
    piece(dk, bc, d);
    piece(dv, bc, value_dim);
    piece(s, br, bc);
    piece(ds, br, bc);
    if (with_slope) piece(slope, br, bc);
    piece(lse2, br);
    piece(lse2_low, br);
    piece(delta, br);
    piece(k, bc, cols(d));
    piece(k_t, cols(d), bc);
    if constexpr (pairs) {
      piece(k_rows, cols(bc), d);
      piece(v, bc, cols(value_dim));
    }
    piece(v_t, cols(value_dim), bc);
    piece(q, br, cols(d));
    piece(dout, br, cols(value_dim));
    if constexpr (pairs) {
      piece(q_rows, cols(br), d);
      piece(dout_rows, cols(br), value_dim);
      piece(p_op, cols(br), bc);
      piece(ds_op, br, cols(bc));
    }
  }
  static constexpr std::size_t footprint(index_t br, index_t bc, index_t d, index_t dv, bool slope) {
    return pieces_bytes<BackwardTiles>(br, bc, d, dv, slope);
  }
  /// For br query rows and bc keys (BackwardTilePlan).
  static BackwardTiles carve(ScratchArena& arena, index_t br, index_t bc, index_t d, index_t dv, bool slope) {
    return carve_pieces<BackwardTiles>(arena, br, bc, d, dv, slope);
  }

  /// The B operands of the products summed over rows: the tile itself, or its paired rows.
  const Tile<Op>& queries_as_rows() const { return pairs ? q_rows : q; }
  const Tile<Op>& dout_as_rows() const { return pairs ? dout_rows : dout; }

  /// The resident key tiles narrowed to keys [k0, k0 + c) of the key tile (k0 even, so
  /// that pairs of key rows stay whole): a query tile computes only the keys it sees.
  struct KeySpan {
    Tile<Op> k_t, v_t, k_rows;
    Tile<float> dk, dv;
  };
  KeySpan keys(index_t k0, index_t c) const {
    return {k_t.slice_cols(k0, c), v_t.slice_cols(k0, c),
            pairs ? k_rows.slice_rows(k0 / 2, (c + 1) / 2) : k.slice_rows(k0, c), dk.slice_rows(k0, c),
            dv.slice_rows(k0, c)};
  }
};

/// What the backward's preprocessing carves for n query rows: O and dO (n x dv) and D.
struct BackwardPreprocessTiles {
  Tile<float> o, dout;
  TileVector<float> delta;

  template <class Piece>
  constexpr void pieces(Piece& piece, index_t n, index_t dv) {
    piece(o, n, dv);
    piece(dout, n, dv);
    piece(delta, n);
  }
  static constexpr std::size_t footprint(index_t n, index_t dv) { return pieces_bytes<BackwardPreprocessTiles>(n, dv); }
  static BackwardPreprocessTiles carve(ScratchArena& arena, index_t n, index_t dv) {
    return carve_pieces<BackwardPreprocessTiles>(arena, n, dv);
  }
};

}  // namespace tileattn::kernels
