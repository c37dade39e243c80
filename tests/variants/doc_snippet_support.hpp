// tests/variants/doc_snippet_support.hpp: what the generated test of docs/options.md's C++
// blocks needs around each block: the headers the snippets use, random inputs for the
// setup block's q, k, v, and the NaN check run on its o and lse afterwards.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace tileattn::test::doc {

/// Fills a buffer with N(0, 1) values from a fixed seed.
inline void fill_normal(std::vector<float>& x, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& e : x) e = normal(rng);
}

/// Elements that are NaN (an LSE of -inf is fine: a row that saw no key).
inline std::size_t count_nan(const std::vector<float>& x) {
  std::size_t n = 0;
  for (float e : x) n += std::isnan(e);
  return n;
}

}  // namespace tileattn::test::doc
