// tests/support/expect_throw_naming.hpp: EXPECT_THROW_NAMING, the check that a statement
// throws tileattn::invalid_argument naming the parameter it should (the paged suites' form
// of the validation tests).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "tileattn/core/error.hpp"

/// The statement throws tileattn::invalid_argument whose parameter() is `name`.
#define EXPECT_THROW_NAMING(statement, name)                                              \
  do {                                                                                    \
    try {                                                                                 \
      statement;                                                                          \
      ADD_FAILURE() << "no exception; expected one naming " << (name);                    \
    } catch (const tileattn::invalid_argument& e) {                                       \
      EXPECT_EQ(e.parameter(), std::string(name)) << e.what();                            \
    }                                                                                     \
  } while (0)
