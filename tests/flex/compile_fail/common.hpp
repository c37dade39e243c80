// tests/flex/compile_fail/common.hpp: the views every compile_fail case calls flex with.
#pragma once
#include <tileattn/flex.hpp>

#include <vector>

namespace flex_case {
using tileattn::index_t;
inline std::vector<float> buffer(64 * 4 * 2 * 16);
inline std::vector<float> lse_buffer(64 * 2 * 4);
inline auto view() { return tileattn::make_bshd(buffer.data(), 1, 64, 2, 16); }
inline auto lse() { return tileattn::make_lse(lse_buffer.data(), 1, 2, 64); }
}  // namespace flex_case
