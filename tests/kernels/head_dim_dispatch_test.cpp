// tests/kernels/head_dim_dispatch_test.cpp: the supported head dims and the one run-time to
// compile-time head_dim switch (kernels/head_dim_dispatch.hpp).
#include <gtest/gtest.h>

#include "tileattn/kernels/head_dim_dispatch.hpp"

namespace tileattn {
namespace {

TEST(HeadDimDispatch, SupportedList) {
  const std::array<index_t, 6> expected{32, 64, 80, 96, 128, 256};
  EXPECT_EQ(supported_head_dims, expected);
  for (index_t d = -1; d <= 600; ++d) {
    const bool listed = std::find(expected.begin(), expected.end(), d) != expected.end();
    EXPECT_EQ(head_dim_supported(d), listed) << d;
  }
}

TEST(HeadDimDispatch, PassesTheCompileTimeValueAndReturnsTheResult) {
  for (index_t d : supported_head_dims) {
    const index_t got = detail::dispatch_head_dim(d, [](auto head_dim) {
      constexpr index_t D = decltype(head_dim)::value;  // usable as a template argument
      static_assert(D > 0);
      return D * 10 + 1;
    });
    EXPECT_EQ(got, d * 10 + 1);
  }
}

TEST(HeadDimDispatch, ThrowsForUnsupported) {
  for (index_t d : {0, 1, 48, 100, 512}) {
    try {
      detail::dispatch_head_dim(d, [](auto) { return 0; });
      ADD_FAILURE() << "no error for head_dim " << d;
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), "head_dim");
      EXPECT_NE(std::string(e.what()).find(std::to_string(d)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tileattn
