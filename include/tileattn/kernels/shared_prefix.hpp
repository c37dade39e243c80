// tileattn/kernels/shared_prefix.hpp: prefix-once attention (FlashInfer's cascade
// attention) for a paged batch whose sequences share prefix pages (KvCache::fork,
// share_prefix: their block tables start with the same page ids). The shared keys are
// attended once per group of sequences, with the query rows of every member as rows of one
// product, each sequence's own keys after them by its own items, and the two partial
// states merged exactly (max and sum kept apart, ops/merge_states.hpp), so a decode step
// reads the shared pages once per group and K/V head instead of once per sequence.
//
// What it holds:
//   - visible_prefix_keys, find_shared_prefixes: the groups, from the block table's page
//     ids. A sequence may join one when every one of its query rows sees all the shared
//     keys (its window, causal diagonal and attention chunk cover them: decode and causal
//     verify after the prefix do) and it has few query rows (split-KV's rule); only whole
//     pages within every member's visible keys are shared. The groups depend on the page
//     ids, the query lengths and shared_prefix_min_keys alone, never on the key tile (so
//     never on the micro-kernel set or the SRAM budget): the members' own items start
//     their key tiles right after the shared keys (kernels/forward.hpp, key_range).
//     One level: a group shares the pages all its members share (no tree of prefixes).
//   - SharedPrefixPlan: the prefix pass as a paged varlen batch of its own: sequence g is
//     group g, its queries the members' queries one after another (gathered per call), its
//     keys the shared ones through the first member's table row, no mask, no sink; its tile
//     plan and work list (every group writes partial states, split-KV chunks where it
//     splits), and each member's PrefixStates (kernels/work_list.hpp), which the batch's own
//     work list and merges take.
//   - check_shared_pages: a call's block table must still share what the plan grouped.
//   - run_shared_prefix: the prefix pass's items and the batch's own items in one parallel
//     loop (prefix items first), then the merges, which add a sink once per row.
// The options under which a row's keys may be split at the prefix (no ALiBi, bias or mask,
// whose scores depend on where the query is; not batch-invariant) are the paged planner's to
// check (kernels/paged_plan.hpp, shared_prefix_allowed).
// Groups, chunks and tiles depend on the batch's shape and page ids only, never on the
// thread count, so every thread count and backend gives the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "tileattn/core/error.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/kernels/forward.hpp"
#include "tileattn/kernels/key_split.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn {

/// One group of prefix-once attention (public: PagedPlan::shared_prefix_groups()): the
/// sequences whose block tables start with the same `pages` page ids; their first `keys`
/// keys (pages * page_size) are attended once for all of them.
struct SharedPrefixGroup {
  std::vector<index_t> members;  // batch indices, ascending
  index_t pages = 0;             // the table entries every call must still share
  index_t keys = 0;
};

}  // namespace tileattn

namespace tileattn::kernels {

/// The keys [0, n) every query row of sequence `seq` sees whole (its window, causal
/// diagonal and attention chunk allow all of them), or 0 when the sequence may not join a
/// group: no queries, more than max_query_rows query rows (positions x group), or a first
/// visible key after key 0 for some row.
template <class T, class KV>
index_t visible_prefix_keys(const ForwardParams<T, KV>& p, const SequenceRange& seq, index_t max_query_rows) {
  if (seq.q_len == 0 || seq.q_len * p.group_size() > max_query_rows) return 0;
  const ops::KeyWindow window = ops::KeyWindow::of(p, seq);
  if (window.first(seq.q_len - 1) > 0) return 0;  // first() never decreases: the last row's is the largest
  return window.end(0);                            // end() never decreases: the first row's is the smallest
}

/// The groups of sequences of p's paged batch that share at least min_keys keys of whole
/// prefix pages (compared by page id).
/// Sequences are first bucketed by their first page, so a batch without sharing costs a sort
/// of its sequences; a bucket is sorted by its rows and cut where neighbours share fewer
/// than min_keys keys, and each run of two or more becomes a group sharing what all of its
/// members share.
template <class T, class KV>
std::vector<SharedPrefixGroup> find_shared_prefixes(const ForwardParams<T, KV>& p, index_t min_keys,
                                                    index_t max_query_rows) {
  const index_t page_size = p.k.shape[dim::seqlen];
  const auto& table = p.block_table;
  struct Candidate {
    index_t b, pages;
  };
  std::vector<Candidate> candidates;
  for (index_t b = 0; b < p.batch(); ++b) {
    const index_t pages = visible_prefix_keys(p, p.sequence(b), max_query_rows) / page_size;
    if (pages * page_size >= std::max<index_t>(min_keys, 1)) candidates.push_back({b, pages});
  }
  const auto page = [&](const Candidate& c, index_t j) { return table(c.b, j); };
  const auto shared_pages = [&](const Candidate& a, const Candidate& c) {
    const index_t n = std::min(a.pages, c.pages);
    index_t j = 0;
    while (j < n && page(a, j) == page(c, j)) ++j;
    return j;
  };
  const auto shared_keys = [&](index_t pages) { return pages * page_size; };
  std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& c) {
    return page(a, 0) != page(c, 0) ? page(a, 0) < page(c, 0) : a.b < c.b;
  });
  std::vector<SharedPrefixGroup> groups;
  for (std::size_t lo = 0; lo < candidates.size();) {
    std::size_t hi = lo + 1;
    while (hi < candidates.size() && page(candidates[hi], 0) == page(candidates[lo], 0)) ++hi;
    if (hi - lo >= 2) {  // one first page: order by the rows, then cut where neighbours share too little
      const auto first = candidates.begin() + static_cast<std::ptrdiff_t>(lo);
      const auto last = candidates.begin() + static_cast<std::ptrdiff_t>(hi);
      std::sort(first, last, [&](const Candidate& a, const Candidate& c) {
        const index_t j = shared_pages(a, c);
        if (j < std::min(a.pages, c.pages)) return page(a, j) < page(c, j);
        return a.pages != c.pages ? a.pages < c.pages : a.b < c.b;
      });
      for (std::size_t run = lo; run < hi;) {
        std::size_t end = run + 1;
        index_t pages = candidates[run].pages;
        while (end < hi) {
          const index_t with_next = std::min(pages, shared_pages(candidates[end - 1], candidates[end]));
          if (shared_keys(with_next) < min_keys) break;
          pages = with_next;
          ++end;
        }
        if (end - run >= 2) {
          SharedPrefixGroup g;
          g.keys = shared_keys(pages);
          g.pages = pages;
          for (std::size_t m = run; m < end; ++m) g.members.push_back(candidates[m].b);
          std::sort(g.members.begin(), g.members.end());
          groups.push_back(std::move(g));
        }
        run = end;
      }
    }
    lo = hi;
  }
  std::sort(groups.begin(), groups.end(),
            [](const SharedPrefixGroup& a, const SharedPrefixGroup& c) { return a.members[0] < c.members[0]; });
  return groups;
}

/// The prefix pass of a batch (file comment): its groups, the pass's own varlen paged
/// batch (query positions cu_rows, keys `keys` per group), tiles and work list, and the
/// PrefixStates of every sequence of the batch (chunks 0 outside the groups).
struct SharedPrefixPlan {
  std::vector<SharedPrefixGroup> groups;
  std::vector<std::int32_t> cu_rows;      // groups + 1: group g's gathered query positions [cu_rows[g], cu_rows[g + 1])
  std::vector<std::int32_t> keys;         // per group: its shared keys (the pass's cache_seqlens)
  index_t table_width = 0;                // the widest group's pages (the pass's block table)
  TilePlan tiles;
  ForwardWorkList work;                   // the pass's items; its merges() say where each group's states are
  std::vector<PrefixStates> of_sequence;  // per batch sequence

  /// The o_accum rows the pass's states take (the batch's own list starts after them).
  index_t partial_rows() const { return work.partial_rows(); }
};

/// The params of the prefix pass of sp for the call p: the gathered queries q_rows
/// ([1, cu_rows.back(), heads_q, head_dim], contiguous) and table rows `table` ([groups,
/// table_width]); no mask, window, ALiBi, bias or sink (the merge adds the sink); the
/// scale, softcap and 8-bit scales of p. Its O is never written (every group writes
/// partial states): the view has no data.
template <class T, class KV>
ForwardParams<T, KV> prefix_params(const ForwardParams<T, KV>& p, const std::vector<std::int32_t>& cu_rows,
                                   const std::vector<std::int32_t>& keys, index_t table_width, const T* q_rows,
                                   const std::int32_t* table) {
  ForwardParams<T, KV> pp = p;
  static_cast<ScoreOptions&>(pp) = ScoreOptions{};
  pp.softcap = p.softcap;
  const index_t groups = static_cast<index_t>(keys.size()), rows = cu_rows.back();
  pp.q = make_bshd(q_rows, 1, rows, p.heads(), p.head_dim());
  pp.o = make_bshd(static_cast<T*>(nullptr), 1, rows, p.heads(), p.head_dim_v());
  pp.lse = {};
  pp.row_max = {};
  pp.row_sum = {};
  pp.cu_seqlens_q = cu_rows.data();
  pp.cu_seqlens_k = nullptr;
  pp.num_sequences = groups;
  pp.block_table = {table, {groups, std::max<index_t>(table_width, 1)}, {std::max<index_t>(table_width, 1), 1}};
  pp.cache_seqlens = keys.data();
  return pp;
}

/// The prefix pass's plan for `groups` (find_shared_prefixes) of the batch p under the
/// call's options: tiles from forward_tiles (the budget, the threads), the pass's key split
/// from choose_split (kernels/key_split.hpp), every group writing partial states.
template <class T, class KV>
SharedPrefixPlan make_shared_prefix_plan(const ForwardParams<T, KV>& p, std::vector<SharedPrefixGroup> groups,
                                         const PagedOptions& options) {
  std::vector<std::int32_t> cu_rows{0}, keys;
  index_t width = 0, longest_rows = 0, longest_keys = 0;
  for (const SharedPrefixGroup& g : groups) {
    index_t rows = 0;
    for (index_t b : g.members) rows += p.sequence(b).q_len;
    cu_rows.push_back(static_cast<std::int32_t>(cu_rows.back() + rows));
    keys.push_back(static_cast<std::int32_t>(g.keys));
    width = std::max(width, g.pages);
    longest_rows = std::max(longest_rows, rows);
    longest_keys = std::max(longest_keys, g.keys);
  }
  const ForwardParams<T, KV> pp = prefix_params<T, KV>(p, cu_rows, keys, width, nullptr, nullptr);
  PlanShape shape{p.head_dim(), p.head_dim_v(), longest_rows, longest_keys, p.group_size(),
                  static_cast<index_t>(groups.size()) * p.heads_kv(), tile_operands_for<T, KV>()};
  const TilePlan tiles = forward_tiles(shape, options);
  const index_t heads_per_item = in_place_heads_per_item(pp, tiles);
  KeySplit split = choose_split(pp, tiles.key_tile_rows, longest_keys, options, heads_per_item);
  split.partial_states = true;
  ForwardWorkList work(pp, tiles, split, heads_per_item);
  std::vector<PrefixStates> of_sequence(static_cast<std::size_t>(p.batch()));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const Merge& m = work.merges()[g];  // every group has query rows: one Merge each, in order
    const index_t rows = m.range.q_len;
    index_t offset = 0;
    for (index_t b : groups[g].members) {
      of_sequence[static_cast<std::size_t>(b)] = {groups[g].keys, m.chunks, m.partial + offset, p.heads() * rows, rows};
      offset += p.sequence(b).q_len;
    }
  }
  return {std::move(groups), std::move(cu_rows), std::move(keys), width, tiles, std::move(work), std::move(of_sequence)};
}

/// Throws tileattn::invalid_argument naming "plan" unless every group's members still
/// start with the same page ids in the call's block table (a plan's groups come from the
/// table it was made with).
template <class T, class KV>
void check_shared_pages(const ForwardParams<T, KV>& p, const SharedPrefixPlan& sp) {
  const auto& table = p.block_table;
  for (const SharedPrefixGroup& g : sp.groups) {
    const index_t lead = g.members[0];
    for (index_t b : g.members)
      for (index_t j = 0; j < g.pages; ++j)
        TILEATTN_REQUIRE(table(b, j) == table(lead, j), "plan",
                         "was made for block tables whose rows " + std::to_string(lead) + " and " +
                             std::to_string(b) + " share their first " + std::to_string(g.pages) +
                             " pages (prefix-once attention); in this call's block_table they differ at entry " +
                             std::to_string(j));
  }
}

/// Runs a paged batch with shared prefixes: the prefix pass of sp and the batch's own work
/// list `work` (made with sp.of_sequence; tiles `tiles`), in one parallel loop, then the
/// merges. p's o_accum, max_accum and sum_accum hold work.partial_rows() rows (the pass's
/// first). Checks the block table first (check_shared_pages). Returns the bytes counted:
/// the kernels' and the gather of the queries (read once, written once).
template <io_policy Io, class T, class KV>
IoCounts run_shared_prefix(const ForwardParams<T, KV>& p, const TilePlan& tiles, const ForwardWorkList& work,
                           const SharedPrefixPlan& sp, const Execution& exec) {
  check_shared_pages(p, sp);
  const index_t heads = p.heads(), d = p.head_dim();
  std::vector<T> q_rows(static_cast<std::size_t>(sp.cu_rows.back() * heads * d));
  const auto width = static_cast<std::size_t>(std::max<index_t>(sp.table_width, 1));
  std::vector<std::int32_t> table(sp.groups.size() * width);
  IoCounts gather;
  for (std::size_t g = 0; g < sp.groups.size(); ++g) {
    const SharedPrefixGroup& group = sp.groups[g];
    for (index_t j = 0; j < group.pages; ++j)
      table[g * width + static_cast<std::size_t>(j)] = p.block_table(group.members[0], j);
    T* out = q_rows.data() + static_cast<std::ptrdiff_t>(sp.cu_rows[g]) * heads * d;
    for (index_t b : group.members) {
      const SequenceRange seq = p.sequence(b);
      for (index_t i = 0; i < seq.q_len; ++i)
        for (index_t h = 0; h < heads; ++h, out += d) {
          const T* in = p.q.ptr(seq.view_batch, seq.q_start + i, h, 0);
          for (index_t c = 0; c < d; ++c) out[c] = in[c * p.q.stride[dim::head_dim]];
        }
    }
  }
  if constexpr (Io::enabled) {
    gather.bytes_read = gather.bytes_written = static_cast<std::uint64_t>(q_rows.size()) * sizeof(T);
  }
  ForwardParams<T, KV> pp = prefix_params<T, KV>(p, sp.cu_rows, sp.keys, sp.table_width, q_rows.data(), table.data());
  const std::size_t pass_bytes = in_place_bytes_of(pp, sp.tiles, sp.work), own_bytes = in_place_bytes_of(p, tiles, work);
  const index_t pass_items = sp.work.size(), count = pass_items + work.size();
  std::vector<Io> io(static_cast<std::size_t>(worker_count(exec, count)));
  parallel_for(exec, count, [&](index_t item, int worker) {
    Io& counter = io[static_cast<std::size_t>(worker)];
    if (item < pass_items) run_item<PagedKv>(pp, sp.tiles, sp.work[item], pass_bytes, ops::BuiltinScores{}, counter);
    else run_item<PagedKv>(p, tiles, work[item - pass_items], own_bytes, ops::BuiltinScores{}, counter);
  });
  run_merges(p, tiles, work, exec, io);
  IoCounts total = total_counts(io);
  total += gather;
  return total;
}

}  // namespace tileattn::kernels
