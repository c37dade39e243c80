// tileattn/kernels/head_dim_dispatch.hpp: the head dimensions tileattn compiles kernels for,
// and the one switch that turns a run-time head_dim into a compile-time one.
#pragma once

#include <array>
#include <string>
#include <type_traits>

#include "tileattn/core/error.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn {

inline constexpr std::array<index_t, 6> supported_head_dims{32, 64, 80, 96, 128, 256};

inline bool head_dim_supported(index_t d) {
  for (index_t s : supported_head_dims)
    if (s == d) return true;
  return false;
}

template <index_t D>
using HeadDim = std::integral_constant<index_t, D>;

namespace detail {

/// Calls f(HeadDim<d>{}) for a supported d; throws invalid_argument("head_dim") otherwise.
template <class F>
decltype(auto) dispatch_head_dim(index_t d, F&& f) {
  switch (d) {
    case 32: return f(HeadDim<32>{});
    case 64: return f(HeadDim<64>{});
    case 80: return f(HeadDim<80>{});
    case 96: return f(HeadDim<96>{});
    case 128: return f(HeadDim<128>{});
    case 256: return f(HeadDim<256>{});
  }
  throw invalid_argument("head_dim", std::to_string(d) +
                                         " is not supported (supported: 32, 64, 80, 96, 128, 256)");
}

}  // namespace detail
}  // namespace tileattn
