// tileattn/kernels/paged_plan.hpp: the paged planner: PagedPlan (what plan_forward_paged
// returns and forward_paged reuses) and how it is made from a checked call's params and
// options: the tiles (forward_tiles), the K/V heads per in-place item
// (in_place_heads_per_item), the key split (kernels/key_split.hpp), the work list (each
// item's in-place decision with it), and prefix-once attention's groups and pass where the
// block table shares prefix pages (kernels/shared_prefix.hpp); and the check that a given
// plan was made for a call (its Signature). The entry headers (paged.hpp, flex.hpp, mla.hpp,
// topk.hpp) check a call's arguments, plan it here, and run it (kernels::run_forward or
// run_shared_prefix). A call that makes its own plan does not check it again.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "tileattn/core/error.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/kernels/forward.hpp"
#include "tileattn/kernels/key_split.hpp"
#include "tileattn/kernels/operands.hpp"
#include "tileattn/kernels/shared_prefix.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/ops/score_source.hpp"

namespace tileattn {

/// A batch shape's plan: the tile plan, the key chunking and the work list, made once
/// (plan_forward_paged) and reused by forward_paged for every call with the same shapes, query
/// lengths, cache_seqlens, masks and options (checked; a mismatch throws "plan").
/// Immutable: one plan may serve concurrent calls.
class PagedPlan {
 public:
  const TilePlan& tiles() const { return tiles_; }
  /// Keys per split-KV chunk (0: no split).
  index_t keys_per_split() const { return split_.keys_per_split; }
  /// The partial-state rows split-KV and prefix-once write (each head_dim_v + 2 floats: O,
  /// max and sum).
  index_t partial_rows() const { return work_.partial_rows(); }
  /// Prefix-once attention's groups and prefix pass (PagedOptions::shared_prefix); nullptr:
  /// none, every sequence attends all its keys itself.
  const kernels::SharedPrefixPlan* shared_prefix() const { return shared_prefix_.get(); }
  /// Prefix-once attention's groups, in order of their first member: which sequences attend
  /// which shared keys once together (empty: none; every sequence attends all its keys
  /// itself). The same on every machine, micro-kernel set and SRAM budget: it depends on
  /// the block table's page ids, the query lengths, the options and shared_prefix_min_keys.
  std::span<const SharedPrefixGroup> shared_prefix_groups() const {
    if (!shared_prefix_) return {};
    return shared_prefix_->groups;
  }
  const kernels::KeySplit& split() const { return split_; }

  struct Signature {  // everything the work list depends on
    std::vector<index_t> shape;
    std::vector<std::int32_t> q_lengths, cache_seqlens;
    bool operator==(const Signature&) const = default;
  };

  PagedPlan(const TilePlan& tiles, const kernels::KeySplit& split, kernels::ForwardWorkList work, Signature sig,
            std::shared_ptr<const kernels::SharedPrefixPlan> shared_prefix = nullptr)
      : tiles_(tiles),
        split_(split),
        work_(std::move(work)),
        signature_(std::move(sig)),
        shared_prefix_(std::move(shared_prefix)) {}

  const kernels::ForwardWorkList& work() const { return work_; }
  const Signature& signature() const { return signature_; }

 private:
  TilePlan tiles_;
  kernels::KeySplit split_;
  kernels::ForwardWorkList work_;
  Signature signature_;
  std::shared_ptr<const kernels::SharedPrefixPlan> shared_prefix_;
};

}  // namespace tileattn

namespace tileattn::kernels {

/// Everything a paged plan's work list depends on, but the score source's key tile limit
/// and prefix-once's mark, which the planner and the check add. Unit head_dim strides of K
/// and V are part of it: the work list reads K and V in place only with them.
template <class T, class KV>
PagedPlan::Signature paged_signature(const ForwardParams<T, KV>& p, const PagedOptions& options) {
  PagedPlan::Signature s;
  s.shape = {p.batch(), p.heads(), p.heads_kv(), p.head_dim(), p.head_dim_v(), p.k.shape[dim::seqlen],
             p.causal, static_cast<index_t>(p.alignment), p.diagonal_offset.has_value(),
             p.diagonal_offset.value_or(0), p.window_left, p.window_right, p.attention_chunk,
             static_cast<index_t>(effective_sram_budget(options)), options.num_splits, options.batch_invariant,
             static_cast<index_t>(tile_operands_for<T, KV>()), options.shared_prefix,
             options.shared_prefix_min_keys, p.k.stride[dim::head_dim] == 1, p.v.stride[dim::head_dim] == 1};
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceRange seq = p.sequence(b);
    s.q_lengths.push_back(static_cast<std::int32_t>(seq.q_len));
    s.cache_seqlens.push_back(static_cast<std::int32_t>(seq.k_len));
  }
  return s;
}

/// The plan of a paged call whose score modifiers come from `scores` (ops::BuiltinScores,
/// or a flex call's ops::FlexScores: its block mask caps the key tile and shapes the work
/// estimates).
template <class T, class KV, class Scores>
PagedPlan make_paged_plan_scored(const ForwardParams<T, KV>& p, index_t longest_q, index_t longest_k,
                                 const PagedOptions& options, const Scores& scores) {
  PlanShape shape{p.head_dim(), p.head_dim_v(), longest_q, longest_k, p.group_size(),
                  p.batch() * p.heads_kv(), tile_operands_for<T, KV>()};
  shape.key_tile_limit = scores.key_tile_limit();
  const TilePlan tiles = forward_tiles(shape, options);
  const index_t heads_per_item = in_place_heads_per_item(p, tiles);
  const KeySplit split = choose_split(p, tiles.key_tile_rows, longest_k, options, heads_per_item);
  PagedPlan::Signature signature = paged_signature(p, options);
  signature.shape.push_back(shape.key_tile_limit);
  return {tiles, split, ForwardWorkList(p, tiles, split, heads_per_item, scores), std::move(signature)};
}

/// A plan with prefix-once groups ends its signature with this mark, which no other plan's
/// has (a flex call cannot run one).
inline constexpr index_t shared_prefix_mark = -32;

/// Whether the options let a row's keys split at a shared prefix: the mask and scores of a
/// prefix key must not depend on the query's position (no ALiBi, bias or mask; the window,
/// causal diagonal and attention chunk are checked per sequence: every row must see every
/// shared key), and batch-invariant mode keeps a sequence's bits apart from the batch's.
/// Nor with rotary embedding: the prefix pass packs the members' queries into one sequence,
/// whose rows start_query_block would rotate at that sequence's positions, not their own.
template <class T, class KV>
bool shared_prefix_allowed(const ForwardParams<T, KV>& p, const PagedOptions& options) {
  return options.shared_prefix && !options.batch_invariant && p.alibi_slopes.empty() && !p.bias.data &&
         !p.mask.data && !p.rotary.enabled() && p.paged();
}

/// The built-in scores' plan: make_paged_plan_scored's, with prefix-once groups where the
/// block table has them (kernels/shared_prefix.hpp): the prefix pass's plan, and the batch's
/// work list remade so that each member attends only the keys after its group's prefix.
template <class T, class KV>
PagedPlan make_paged_plan(const ForwardParams<T, KV>& p, index_t longest_q, index_t longest_k,
                          const PagedOptions& options) {
  PagedPlan plan = make_paged_plan_scored(p, longest_q, longest_k, options, ops::BuiltinScores{});
  if (!shared_prefix_allowed(p, options)) return plan;
  auto groups = find_shared_prefixes(p, options.shared_prefix_min_keys, split_max_query_rows);
  if (groups.empty()) return plan;
  auto shared = std::make_shared<const SharedPrefixPlan>(make_shared_prefix_plan(p, std::move(groups), options));
  ForwardWorkList work(p, plan.tiles(), plan.split(), plan.work().kv_heads_per_item(), ops::BuiltinScores{},
                       {shared->of_sequence, shared->partial_rows()});
  PagedPlan::Signature signature = plan.signature();
  signature.shape.push_back(shared_prefix_mark);
  return {plan.tiles(), plan.split(), std::move(work), std::move(signature), std::move(shared)};
}

/// Throws tileattn::invalid_argument naming "plan" unless `plan` was made for this call:
/// its signature, with the score source's key tile limit and, for a run with prefix-once
/// groups, shared_prefix_mark (a plan with groups fails the check of a run without).
template <class T, class KV>
void check_paged_plan(const ForwardParams<T, KV>& p, const PagedPlan& plan, const PagedOptions& options,
                      index_t key_tile_limit, bool shared_prefix) {
  PagedPlan::Signature signature = paged_signature(p, options);
  signature.shape.push_back(key_tile_limit);
  if (shared_prefix) signature.shape.push_back(shared_prefix_mark);
  TILEATTN_REQUIRE(plan.signature() == signature, "plan",
                   "was made for another batch shape, cache_seqlens, top-k list lengths, K/V head strides, mask or "
                   "options");
}

}  // namespace tileattn::kernels
