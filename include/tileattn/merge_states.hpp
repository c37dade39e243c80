// tileattn/merge_states.hpp: the public merge_states, which combines partial attention
// results over disjoint key sets exactly (FlashInfer's merge_state): split-KV decoding
// (paged.hpp) and ring attention's per-step states (distributed/ring.hpp) merge through it.
#pragma once

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <type_traits>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/detail/paged_checks.hpp"
#include "tileattn/kernels/merge.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/memory/scratch_arena.hpp"

namespace tileattn {

namespace detail {

/// Checks and runs merge_states: states [batch, seqlen, heads, head_dim_v] with LSE
/// [batch, heads, seqlen]; o like them; lse optional. The output may be one of the states
/// exactly (in place); any other overlap is an error.
template <class T>
void merge_states(std::span<const TensorView<const T>> os, std::span<const StridedView<const float, 3>> lses,
                  TensorView<T> o, LseView lse, const Execution& exec) {
  TILEATTN_REQUIRE(!os.empty(), "states", "needs at least one partial state");
  TILEATTN_REQUIRE(os.size() == lses.size(), "lse_states",
          "needs one LSE per state: " + std::to_string(os.size()) + " states, " + std::to_string(lses.size()) + " LSEs");
  check_view(o, "o", padded_layout.names, {false, false, false, false});
  check_head_dim(o.shape[dim::head_dim], "head_dim_v");
  check_no_self_overlap(o, "o");
  const std::array<index_t, 3> lse_shape{o.shape[dim::batch], o.shape[dim::heads], o.shape[dim::seqlen]};
  check_lse(lse, lse_shape, lse_dims);
  if (lse.data) {
    check_no_self_overlap(lse, "lse");
    check_disjoint(lse, "lse", o, "o");
  }
  const auto same = [](const auto& a, const auto& b) {
    return static_cast<const void*>(a.data) == static_cast<const void*>(b.data) && a.shape == b.shape && a.stride == b.stride;
  };
  for (std::size_t c = 0; c < os.size(); ++c) {
    const std::string name = "states[" + std::to_string(c) + "]", lse_name = "lse_states[" + std::to_string(c) + "]";
    check_view(os[c], name, padded_layout.names);
    for (std::size_t d = 0; d < 4; ++d) check_same_extent(o, "o", os[c], name, d, padded_layout.names[d]);
    check_view(lses[c], lse_name, lse_dims);
    for (std::size_t d = 0; d < 3; ++d)
      TILEATTN_REQUIRE(lses[c].shape[d] == lse_shape[d], dim_name(lse_name, "shape", d, lse_dims[d]),
              "must be " + std::to_string(lse_shape[d]) + ", got " + std::to_string(lses[c].shape[d]));
    if (!same(o, os[c])) check_disjoint(o, "o", os[c], name);
    check_disjoint(o, "o", lses[c], lse_name);
    if (lse.data && !same(lse, lses[c])) check_disjoint(lse, "lse", lses[c], lse_name);
    if (lse.data) check_disjoint(lse, "lse", os[c], name);
  }
  validate_execution(exec);
  const index_t heads = o.shape[dim::heads], dv = o.shape[dim::head_dim], seqlen = o.shape[dim::seqlen];
  const index_t rows = kernels::merge_block_rows(std::min<index_t>(seqlen, 64), dv, max_sram_budget_bytes);
  const index_t items = o.shape[dim::batch] * heads;
  parallel_for(exec, items, [&](index_t item, int) {
    const index_t b = item / heads, h = item % heads;
    auto tiles = kernels::MergeTiles::carve(worker_scratch(kernels::MergeTiles::footprint(rows, dv)), rows, dv);
    const auto state = [&](index_t c) {
      const auto& oc = os[static_cast<std::size_t>(c)];
      const auto& lc = lses[static_cast<std::size_t>(c)];
      return kernels::PartialState<T, kernels::LseRows>{head_matrix(oc, b, h), {&lc(b, h, 0), lc.stride[2]}};
    };
    NoIoCounting io;
    kernels::merge_rows(static_cast<index_t>(os.size()), state, head_matrix(o, b, h), lse.data ? &lse(b, h, 0) : nullptr,
                        lse.stride[2], nullptr, tiles, io);
  });
}

}  // namespace detail

/// Combines partial attention results over disjoint key sets (FlashInfer's merge_state):
/// for each (batch, position, head), LSE = log(sum_c e^LSE_c) and O = sum_c
/// e^(LSE_c - LSE) O_c, in the order given. states are O_c [batch, seqlen, heads,
/// head_dim_v] as forward() writes them, lse_states their LSE [batch, heads, seqlen]; a
/// state with LSE -inf saw no key and adds nothing (all -inf: O = 0, LSE = -inf); a NaN
/// LSE makes the row NaN (so does +inf, and, since the merge works in log2 units, any LSE
/// above max_natural_log_magnitude, about 2.36e38; one below its negative counts as -inf).
/// o may be one of the states itself (in place); lse is optional.
/// Accumulates in float; O is rounded once to its type.
template <class T>
void merge_states(std::type_identity_t<std::span<const TensorView<const T>>> states,
                  std::span<const StridedView<const float, 3>> lse_states, const TensorView<T>& o, LseView lse,
                  const Execution& execution = {}) {
  detail::merge_states<T>(states, lse_states, o, lse, execution);
}

/// The two-state form: (o, lse) = merge of (o_a, lse_a) and (o_b, lse_b).
template <class T>
void merge_states(std::type_identity_t<TensorView<const T>> o_a, StridedView<const float, 3> lse_a,
                  std::type_identity_t<TensorView<const T>> o_b, StridedView<const float, 3> lse_b, const TensorView<T>& o,
                  LseView lse, const Execution& execution = {}) {
  const TensorView<const T> states[2] = {o_a, o_b};
  const StridedView<const float, 3> lses[2] = {lse_a, lse_b};
  detail::merge_states<T>(states, lses, o, lse, execution);
}

}  // namespace tileattn
