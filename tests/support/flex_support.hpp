// tests/support/flex_support.hpp: the inputs the flex tests share: N(0, sd) values, document
// ids of random-length documents, random block-sparse layouts (fixed seeds).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tileattn/core/strided_view.hpp"

namespace tileattn::test {

inline std::vector<float> normal_values(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

/// Document ids of n positions: consecutive documents of 1 to max_len positions.
inline std::vector<std::int32_t> document_ids(index_t n, std::uint64_t seed, index_t max_len) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids;
  std::int32_t doc = 0;
  while (static_cast<index_t>(ids.size()) < n) {
    const auto len = static_cast<index_t>(1 + rng() % static_cast<std::uint64_t>(max_len));
    for (index_t i = 0; i < len && static_cast<index_t>(ids.size()) < n; ++i) ids.push_back(doc);
    ++doc;
  }
  return ids;
}

/// n blocks, each set with probability `density`.
inline std::vector<std::uint8_t> random_layout(index_t n, double density, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution set(density);
  std::vector<std::uint8_t> layout(static_cast<std::size_t>(n));
  for (auto& x : layout) x = set(rng) ? 1 : 0;
  return layout;
}

}  // namespace tileattn::test
