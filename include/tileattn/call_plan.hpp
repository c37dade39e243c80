// tileattn/call_plan.hpp: CallPlan, the plan a call reuses (ForwardPlan in forward.hpp,
// BackwardPlan in backward.hpp): the tiles a planner chose for a call's shapes, SRAM budget
// and thread count, and that signature, against which a call given the plan is checked
// (docs/api.md, "Plans").
#pragma once

#include <cstddef>
#include <string>

#include "tileattn/core/error.hpp"

namespace tileattn {

/// Tiles planned by Planner(shape, sram_budget_bytes, workers) once, for every call of that
/// signature. Immutable: one plan may serve concurrent calls.
template <class Shape, class Tiles, Tiles (*Planner)(const Shape&, std::size_t, int)>
class CallPlan {
 public:
  struct Signature {  // everything the tiles depend on
    Shape shape;
    std::size_t sram_budget_bytes = 0;
    int workers = 1;
    bool operator==(const Signature&) const = default;
  };

  explicit CallPlan(const Signature& signature)
      : tiles_(Planner(signature.shape, signature.sram_budget_bytes, signature.workers)), signature_(signature) {}

  const Tiles& tiles() const { return tiles_; }
  const Signature& signature() const { return signature_; }

  /// The tiles of a call of `signature`: `given`'s, checked against it (a plan made for
  /// another call throws invalid_argument naming "plan"), or planned now.
  static Tiles tiles_for(const Signature& signature, const CallPlan* given, const char* plan_call) {
    if (given == nullptr) return Planner(signature.shape, signature.sram_budget_bytes, signature.workers);
    TILEATTN_REQUIRE(given->signature() == signature, "plan",
                     std::string("was made for another call (") + plan_call +
                         ": the same shapes, options, sram_budget_bytes and thread count)");
    return given->tiles();
  }

 private:
  Tiles tiles_;
  Signature signature_;
};

}  // namespace tileattn
