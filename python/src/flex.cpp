// python/src/flex.cpp: tileattn._C's flexible attention over a fixed menu of the library's
// mods (flex/mods.hpp), chosen at run time: one compiled kernel per element type serves every
// menu entry. The mask is the AND of clauses, each one of the library's mask_mods; the
// score_mod is none or a relative-position bias table (softcap and ALiBi are the options').
// The block mask is built per call from the mask (one for every sequence and head: the menu's
// masks depend on positions only), so empty blocks are skipped and full ones unmasked.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <variant>
#include <vector>

#include "bindings.hpp"
#include "dispatch.hpp"
#include "options.hpp"
#include "views.hpp"
#include "tileattn/flex.hpp"

namespace tileattn::python {

namespace {

/// The mask menu, in the order of the kinds Python's tileattn.flex names.
using MaskClause = std::variant<flex::causal, flex::sliding_window, flex::document, flex::prefix_lm,
                                flex::global_window, flex::dilated_window, flex::block_sparse>;

/// The AND of a list of clauses (no clause: every key visible).
struct MenuMask {
  std::vector<MaskClause> clauses;
  bool operator()(index_t b, index_t h, index_t q, index_t kv) const {
    for (const MaskClause& c : clauses)
      if (!std::visit([&](const auto& m) { return m(b, h, q, kv); }, c)) return false;
    return true;
  }
};

/// The score menu: the identity or a relative-position bias table (each with its derivative).
struct MenuScore {
  std::optional<flex::relative_bias> bias;
  float operator()(float s, index_t b, index_t h, index_t q, index_t kv) const {
    return bias ? (*bias)(s, b, h, q, kv) : s;
  }
  float grad(float, index_t, index_t, index_t, index_t) const { return 1.0f; }
};

/// What Python passes: clauses as (kind, a, b, c) quadruples, the arrays some kinds read.
struct FlexSpec {
  std::vector<std::int64_t> clauses;
  OptionalIn doc_q, doc_kv, layout, table;
  index_t max_distance = 0;
  index_t block_q = 128, block_kv = 128;
};

std::span<const std::int32_t> ids(const OptionalIn& a, const char* name, index_t needed) {
  TILEATTN_REQUIRE(a.has_value(), name, "is needed by the document mask");
  const auto s = span_of<const std::int32_t>(a, name);
  TILEATTN_REQUIRE(static_cast<index_t>(s.size()) >= needed, name,
                   "has " + std::to_string(s.size()) + " entries, the sequences need " + std::to_string(needed));
  return s;
}

MenuMask menu_mask(const FlexSpec& spec, index_t seqlen_q, index_t seqlen_k) {
  TILEATTN_REQUIRE(spec.clauses.size() % 4 == 0, "mask", "clauses come as (kind, a, b, c) quadruples");
  MenuMask mask;
  for (std::size_t i = 0; i < spec.clauses.size(); i += 4) {
    const std::int64_t kind = spec.clauses[i], a = spec.clauses[i + 1], b = spec.clauses[i + 2],
                       c = spec.clauses[i + 3];
    switch (kind) {
      case 0: mask.clauses.emplace_back(flex::causal{a}); break;
      case 1: mask.clauses.emplace_back(flex::sliding_window{a, b, c}); break;
      case 2: {  // doc_kv absent: self-attention, doc_q for both
        const auto q_ids = ids(spec.doc_q, "doc_q", seqlen_q);
        const auto kv_ids = spec.doc_kv ? ids(spec.doc_kv, "doc_kv", seqlen_k) : ids(spec.doc_q, "doc_q", seqlen_k);
        mask.clauses.emplace_back(flex::document(q_ids, kv_ids));
        break;
      }
      case 3: mask.clauses.emplace_back(flex::prefix_lm{a}); break;
      case 4:
        TILEATTN_REQUIRE(b >= 0, "window", "must be >= 0, got " + std::to_string(b));
        mask.clauses.emplace_back(flex::global_window{a, b});
        break;
      case 5: {
        TILEATTN_REQUIRE(a >= 0, "window", "must be >= 0, got " + std::to_string(a));
        TILEATTN_REQUIRE(b >= 1, "dilation", "must be >= 1, got " + std::to_string(b));
        mask.clauses.emplace_back(flex::dilated_window{a, b});
        break;
      }
      case 6: {
        TILEATTN_REQUIRE(b >= 1, "block", "must be >= 1, got " + std::to_string(b));
        const auto layout = spec.layout ? view_of<const std::uint8_t, 2>(*spec.layout, "layout")
                                        : StridedView<const std::uint8_t, 2>{};
        TILEATTN_REQUIRE(spec.layout.has_value(), "layout", "is needed by the block-sparse mask");
        const index_t qb = (seqlen_q + b - 1) / b, kb = (seqlen_k + b - 1) / b;
        TILEATTN_REQUIRE(layout.shape[0] >= qb && layout.shape[1] == kb, "layout",
                         "must be [>= " + std::to_string(qb) + ", " + std::to_string(kb) + "] blocks of " +
                             std::to_string(b) + ", got [" + std::to_string(layout.shape[0]) + ", " +
                             std::to_string(layout.shape[1]) + "]");
        TILEATTN_REQUIRE(layout.stride[1] == 1 && layout.stride[0] == kb, "layout", "must be contiguous");
        mask.clauses.emplace_back(
            flex::block_sparse{{layout.data, static_cast<std::size_t>(layout.shape[0] * kb)}, kb, b});
        break;
      }
      default: throw invalid_argument("mask", "unknown clause kind " + std::to_string(kind));
    }
  }
  return mask;
}

MenuScore menu_score(const FlexSpec& spec, index_t heads_q) {
  MenuScore score;
  if (!spec.table) return score;
  TILEATTN_REQUIRE(spec.max_distance >= 0, "max_distance", "must be >= 0, got " + std::to_string(spec.max_distance));
  const auto table = span_of<const float>(spec.table, "table");
  const index_t needed = heads_q * (2 * spec.max_distance + 1);
  TILEATTN_REQUIRE(static_cast<index_t>(table.size()) == needed, "table",
                   "must hold heads_q x (2 max_distance + 1) = " + std::to_string(needed) + " floats, got " +
                       std::to_string(table.size()));
  score.bias = flex::relative_bias{table, spec.max_distance};
  return score;
}

BlockMask<MenuMask> block_mask(const FlexSpec& spec, index_t seqlen_q, index_t seqlen_k, const Execution& exec) {
  return create_block_mask(menu_mask(spec, seqlen_q, seqlen_k), 1, 1, seqlen_q, seqlen_k,
                           BlockSize{spec.block_q, spec.block_kv}, exec);
}

void forward_flex(const InArray& q, const InArray& k, const InArray& v, const OutArray& o, const OptionalOut& lse,
                  const Options& options, const FlexSpec& spec) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const ForwardViews<T, 4> a(q, k, v, o, lse);
    const ForwardOptions f = forward_options(options);
    const MenuScore score = menu_score(spec, a.q.shape[dim::heads]);
    nb::gil_scoped_release release;
    const auto blocks = block_mask(spec, a.q.shape[dim::seqlen], a.k.shape[dim::seqlen], f.execution);
    tileattn::forward_flex(a.q, a.k, a.v, a.o, a.lse, score, blocks, f);
  });
}

void backward_flex(const InArray& q, const InArray& k, const InArray& v, const InArray& o, const InArray& lse,
                   const InArray& dout, const OutArray& dq, const OutArray& dk, const OutArray& dv,
                   const Options& options, const FlexSpec& spec) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const BackwardViews<T, 4> a(q, k, v, o, lse, dout, dq, dk, dv);
    const BackwardOptions b = backward_options(options);
    const MenuScore score = menu_score(spec, a.q.shape[dim::heads]);
    nb::gil_scoped_release release;
    const auto blocks = block_mask(spec, a.q.shape[dim::seqlen], a.k.shape[dim::seqlen], b.execution);
    tileattn::backward_flex(a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv, score, blocks, b);
  });
}

}  // namespace

void bind_flex(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<FlexSpec>(m, "FlexSpec", "A flex call's mask clauses, their arrays and the score_mod's table.")
      .def(nb::init<>())
      .def_rw("clauses", &FlexSpec::clauses)
      .def_rw("doc_q", &FlexSpec::doc_q, nb::arg().none())
      .def_rw("doc_kv", &FlexSpec::doc_kv, nb::arg().none())
      .def_rw("layout", &FlexSpec::layout, nb::arg().none())
      .def_rw("table", &FlexSpec::table, nb::arg().none())
      .def_rw("max_distance", &FlexSpec::max_distance)
      .def_rw("block_q", &FlexSpec::block_q)
      .def_rw("block_kv", &FlexSpec::block_kv);
  m.def("forward_flex", &forward_flex, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "options"_a, "spec"_a,
        "forward() with the menu's mask (AND of clauses, as a block mask) and score_mod.");
  m.def("backward_flex", &backward_flex, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a,
        "options"_a, "spec"_a, "backward() of forward_flex() with the same spec.");
}

}  // namespace tileattn::python
