// tileattn/detail/rotary_checks.hpp: the argument checks of rotary embedding (RotaryOptions,
// core/params.hpp): the tables' views and shapes, every position a call rotates at, and the
// outputs that must not overlap the tables. The forward family (forward.hpp's check_call),
// the cache writes (cache_write.hpp, kv_cache.hpp) and apply_rotary run them before anything
// is written; a bad argument throws tileattn::invalid_argument naming it ("rotary_cos",
// "rotary_sin", "positions").
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "tileattn/core/params.hpp"
#include "tileattn/detail/view_checks.hpp"

namespace tileattn::detail {

inline constexpr std::array<const char*, 2> rotary_table_dims{"max_position", "rotary_dim / 2"};

/// Both tables given, [max_position >= 1, 1 <= rotary_dim / 2 <= head_dim / 2], one shape.
inline void check_rotary_tables(const RotaryOptions& r, index_t head_dim) {
  TILEATTN_REQUIRE(r.cos.data != nullptr, "rotary_cos", "data is null while rotary_sin is set (give both tables)");
  TILEATTN_REQUIRE(r.sin.data != nullptr, "rotary_sin", "data is null while rotary_cos is set (give both tables)");
  check_view(r.cos, "rotary_cos", rotary_table_dims);
  check_view(r.sin, "rotary_sin", rotary_table_dims);
  for (std::size_t d : {0u, 1u}) check_same_extent(r.cos, "rotary_cos", r.sin, "rotary_sin", d, rotary_table_dims[d]);
  TILEATTN_REQUIRE(r.cos.shape[1] <= head_dim / 2, dim_name("rotary_cos", "shape", 1, "rotary_dim / 2"),
                   "rotary_dim = 2 x " + std::to_string(r.cos.shape[1]) + " must be at most head_dim = " +
                       std::to_string(head_dim));
}

/// Positions [first, last] are rows of the tables. `what` names the rows (built on failure).
template <class What>
void check_rotary_positions(const RotaryOptions& r, index_t first, index_t last, const What& what) {
  if (first >= 0 && last < r.cos.shape[0]) return;
  const std::string at = first == last ? "position " + std::to_string(first) + " is"
                                        : "positions " + std::to_string(first) + ".." + std::to_string(last) + " are";
  throw invalid_argument("rotary_cos", what() + ": " + at + " outside the tables' rows [0, rotary_cos.shape[0] = " +
                                           std::to_string(r.cos.shape[0]) + ")");
}

/// An output (written while the tables are read) overlaps neither table.
template <class Out>
void check_disjoint_from_tables(const RotaryOptions& r, const Out& out, const std::string& name) {
  check_disjoint(out, name, r.cos, "rotary_cos");
  check_disjoint(out, name, r.sin, "rotary_sin");
}

/// The rotary options of a forward-family call: the tables (against head_dim), each
/// sequence's query positions (i + the diagonal's offset, ForwardOptions::rotary), and O and
/// the LSE apart from the tables.
template <class T, class KV>
void check_rotary(const ForwardParams<T, KV>& p) {
  if (!p.rotary.enabled()) return;
  check_rotary_tables(p.rotary, p.head_dim());
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceRange seq = p.sequence(b);
    if (seq.q_len == 0) continue;
    const index_t first = p.mask_offset(seq);
    check_rotary_positions(p.rotary, first, first + seq.q_len - 1, [&] {
      return "the " + std::to_string(seq.q_len) + " queries of sequence " + std::to_string(b) + " (" +
             std::to_string(seq.k_len) + " keys)";
    });
  }
  check_disjoint_from_tables(p.rotary, p.o, "o");
  if (p.lse.data) check_disjoint_from_tables(p.rotary, p.lse, "lse");
}

/// The rotary arguments of a write of num_tokens rows (rows_name) of head_dim features at
/// `positions` (one per token; a token whose slot is -1 is skipped and its position not
/// read; slots empty: every token): positions without tables are an error, and so is a
/// negative position ("positions") or one past the tables ("rotary_cos").
inline void check_rotary_write(const RotaryOptions& r, std::span<const std::int64_t> positions,
                               std::span<const std::int64_t> slots, index_t num_tokens, index_t head_dim,
                               const char* rows_name) {
  if (!r.enabled()) {
    TILEATTN_REQUIRE(positions.empty(), "positions", "are given without rotary tables (rotary_cos, rotary_sin)");
    return;
  }
  check_rotary_tables(r, head_dim);
  TILEATTN_REQUIRE(static_cast<index_t>(positions.size()) == num_tokens, "positions",
                   "has " + std::to_string(positions.size()) + " entries, " + rows_name + " has " +
                       std::to_string(num_tokens) + " tokens");
  for (std::size_t i = 0; i < positions.size(); ++i) {  // messages built only on failure
    if (!slots.empty() && slots[i] < 0) continue;
    if (positions[i] < 0)
      throw invalid_argument("positions", "positions[" + std::to_string(i) + "] = " + std::to_string(positions[i]) +
                                              " is negative");
    check_rotary_positions(r, positions[i], positions[i], [&] { return "token " + std::to_string(i); });
  }
}

}  // namespace tileattn::detail
