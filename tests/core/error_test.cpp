// tests/core/error_test.cpp: the exceptions tileattn throws (core/error.hpp): parameter(), the
// what() text, and budget_error being an invalid_argument.
#include <gtest/gtest.h>

#include <type_traits>

#include "tileattn/core/error.hpp"

namespace tileattn {
namespace {

TEST(Errors, InvalidArgumentNamesTheParameter) {
  const invalid_argument e("k.shape[2] (heads)", "must equal q.shape[2] = 4, got 3");
  EXPECT_EQ(e.parameter(), "k.shape[2] (heads)");
  EXPECT_STREQ(e.what(), "tileattn: k.shape[2] (heads): must equal q.shape[2] = 4, got 3");
}

TEST(Errors, BudgetErrorIsAnInvalidArgument) {
  static_assert(std::is_base_of_v<invalid_argument, budget_error>);
  static_assert(std::is_base_of_v<std::invalid_argument, invalid_argument>);
  try {
    throw budget_error("sram_budget_bytes", "too small");
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "sram_budget_bytes");
    EXPECT_STREQ(e.what(), "tileattn: sram_budget_bytes: too small");
  }
}

TEST(Errors, RequireThrowsOnlyWhenFalse) {
  EXPECT_NO_THROW(detail::require(true, "x", "never"));
  try {
    detail::require(false, "softmax_scale", "must be > 0");
    ADD_FAILURE() << "require(false) did not throw";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "softmax_scale");
  }
}

TEST(Errors, TheCheckMacroBuildsItsMessageOnlyOnFailure) {
  int built = 0;
  const auto reason = [&] { ++built; return std::string("must be > 0"); };
  TILEATTN_REQUIRE(1 + 1 == 2, "x", reason());
  EXPECT_EQ(built, 0);
  try {
    TILEATTN_REQUIRE(1 + 1 == 3, "softmax_scale", reason());
    ADD_FAILURE() << "TILEATTN_REQUIRE(false) did not throw";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "softmax_scale");
    EXPECT_STREQ(e.what(), "tileattn: softmax_scale: must be > 0");
  }
  EXPECT_EQ(built, 1);
}

}  // namespace
}  // namespace tileattn
