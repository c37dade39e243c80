// tests/kernels/compile_fail/common.hpp: the params every compile_fail case hands the kernels
// (never run: the cases are compiled with -fsyntax-only), and a well-formed plug-in of each
// kind to start a broken one from.
#pragma once
#include <tileattn/kernels/backward.hpp>
#include <tileattn/kernels/forward.hpp>

#include <cstdint>

namespace kernels_case {
using tileattn::index_t;
namespace kernels = tileattn::kernels;
namespace ops = tileattn::ops;

inline tileattn::ForwardParams<float> forward_params;
inline tileattn::ForwardParams<float, std::int8_t> int8_forward_params;  // 8-bit K/V: scales asked for
inline tileattn::BackwardParams<float> backward_params;
inline tileattn::TilePlan tile_plan;
inline tileattn::BackwardTilePlan backward_plan;
inline tileattn::Execution execution;
}  // namespace kernels_case
