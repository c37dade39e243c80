// The control: the kernels instantiated with every policy tileattn ships (IO policies, K/V
// sources, key tile loaders, score sources, built-in and flex) compile with the same flags
// as the cases beside it, so their failures come from the concepts, not from the set-up;
// and each policy satisfies its concept. And forward/backward on float views, the control of the double_*
// cases.
#include "common.hpp"

#include <tileattn/flex.hpp>
#include <tileattn/tileattn.hpp>

#include <type_traits>
#include <vector>

using namespace kernels_case;
namespace flex = tileattn::flex;

using flex_causal = ops::FlexScores<flex::no_score_mod, flex::causal>;
using grad_mod = decltype(flex::with_grad{[](float s, index_t, index_t, index_t, index_t) { return 2.0f * s; },
                                          [](float, index_t, index_t, index_t, index_t) { return 2.0f; }});
using flex_grad = ops::FlexScores<grad_mod, flex::no_mask>;

static_assert(tileattn::io_policy<tileattn::NoIoCounting>);
static_assert(tileattn::io_policy<tileattn::CountingIo>);
static_assert(kernels::kv_source<kernels::ContiguousKv, tileattn::ForwardParams<float>>);
static_assert(kernels::kv_source<kernels::ContiguousKv, tileattn::ForwardParams<float, std::int8_t>>);
static_assert(kernels::kv_source<kernels::PagedKv, tileattn::ForwardParams<tileattn::bf16>>);
static_assert(kernels::kv_source<kernels::PagedKv, tileattn::ForwardParams<float, tileattn::fp8_e4m3>>);
using builtin_mods = std::invoke_result_t<const ops::BuiltinScores&, const tileattn::ForwardParams<float>&, index_t,
                                          const tileattn::SequenceRange&>;
static_assert(kernels::key_tile_loader<kernels::PackedLoader<kernels::ContiguousKv, float, float, float>, builtin_mods,
                                       tileattn::NoIoCounting>);
static_assert(kernels::key_tile_loader<kernels::InPlaceLoader<kernels::PagedKv, float, std::int8_t>, builtin_mods,
                                       tileattn::CountingIo>);
static_assert(ops::forward_score_source<ops::BuiltinScores, tileattn::ForwardParams<float>, tileattn::CountingIo>);
static_assert(ops::backward_score_source<ops::BuiltinScores, tileattn::BackwardParams<float>, tileattn::CountingIo>);
static_assert(ops::forward_score_source<flex_causal, tileattn::ForwardParams<float>, tileattn::NoIoCounting>);
static_assert(ops::forward_score_source<flex_grad, tileattn::ForwardParams<float>, tileattn::CountingIo>);
static_assert(ops::backward_score_source<flex_grad, tileattn::BackwardParams<float>, tileattn::NoIoCounting>);
static_assert(ops::backward_score_source<flex_causal, tileattn::BackwardParams<float>, tileattn::CountingIo>);

void call() {
  kernels::run_forward<tileattn::CountingIo>(forward_params, tile_plan, execution);
  const kernels::ForwardWorkList work(int8_forward_params, tile_plan);
  kernels::run_forward<tileattn::NoIoCounting, kernels::PagedKv>(int8_forward_params, tile_plan, work, execution);
  kernels::run_forward<tileattn::NoIoCounting>(forward_params, tile_plan, execution, flex_causal{});
  kernels::run_backward<tileattn::NoIoCounting>(backward_params, backward_plan, execution, flex_grad{});
}

int main() {
  std::vector<float> x(16), o(16), dq(16), dk(16), dv(16), lse(4);
  const auto view = tileattn::make_bhsd(x.data(), 1, 1, 4, 4);
  const auto lse_view = tileattn::make_lse(lse.data(), 1, 1, 4);
  tileattn::forward(view, view, view, tileattn::make_bhsd(o.data(), 1, 1, 4, 4), lse_view);
  tileattn::backward(view, view, view, view, lse_view, view, tileattn::make_bhsd(dq.data(), 1, 1, 4, 4),
                     tileattn::make_bhsd(dk.data(), 1, 1, 4, 4), tileattn::make_bhsd(dv.data(), 1, 1, 4, 4));
}
