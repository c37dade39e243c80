// benchmarks/side_by_side/timing.hpp: what the standalone timers (serving, MLA, top-k,
// 4-bit) share: one call's wall time and the median of a run's times. Header-only, standard
// C++ alone, so each timer still builds with g++ -Iinclude on the lent Xeon.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace side_by_side {

/// Seconds of one call of f.
inline double seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The median of v (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace side_by_side
