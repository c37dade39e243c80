// tests/backend/execution_test.cpp: the Execution request and Backend names (backend/execution.hpp).
#include <gtest/gtest.h>

#include <string>

#include "tileattn/backend/execution.hpp"

namespace tileattn {
namespace {

TEST(Execution, DefaultsAndNames) {
  const Execution e;
  EXPECT_EQ(e.backend, Backend::automatic);
  EXPECT_EQ(e.num_threads, 0);
  EXPECT_EQ(std::string(to_string(Backend::automatic)), "automatic");
  EXPECT_EQ(std::string(to_string(Backend::serial)), "serial");
  EXPECT_EQ(std::string(to_string(Backend::openmp)), "openmp");
  EXPECT_EQ(std::string(to_string(Backend::tbb)), "tbb");
}

}  // namespace
}  // namespace tileattn
