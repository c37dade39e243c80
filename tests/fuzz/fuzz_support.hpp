// tests/fuzz/fuzz_support.hpp: what every libFuzzer harness under tests/fuzz/ shares: how a
// harness fails (a message, then abort, so libFuzzer keeps the input), the rule for a
// rejected call (tileattn::invalid_argument naming its parameter, outputs untouched),
// bitwise checks of output buffers against their sentinel, and the option values the
// attention harnesses draw (window sides, attention chunks).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "support/test_support.hpp"

namespace tileattn::fuzz {

inline constexpr float nan = std::numeric_limits<float>::quiet_NaN();
inline constexpr float inf = std::numeric_limits<float>::infinity();

/// Prints "<harness>: <what>" and aborts: libFuzzer reports the input as a crash.
/// A window side (window_left / window_right): unbounded, near INT64_MAX, or 0..48.
inline index_t window_side(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: return -1;
    case 1: return std::numeric_limits<index_t>::max() - in.ConsumeIntegralInRange(0, 2);
    default: return in.ConsumeIntegralInRange<index_t>(0, 48);
  }
}

/// An attention_chunk: mostly off, else 1..48 or near INT64_MAX.
inline index_t attention_chunk(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0: return std::numeric_limits<index_t>::max() - in.ConsumeIntegralInRange(0, 2);
    case 1: case 2: return in.ConsumeIntegralInRange<index_t>(1, 48);
    default: return 0;
  }
}

[[noreturn]] inline void fail(const char* harness, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", harness, what.c_str());
  std::abort();
}

/// A rejection must name its parameter, and the parameter must appear in the message.
inline void require_named(const char* harness, const tileattn::invalid_argument& err) {
  if (err.parameter().empty() || std::string(err.what()).find(err.parameter()) == std::string::npos)
    fail(harness, std::string("an error that does not name its parameter: ") + err.what());
}

/// Every element of `buffer` holds exactly `value`'s bits.
template <class T>
bool all_bits_equal(const std::vector<T>& buffer, T value) {
  return std::all_of(buffer.begin(), buffer.end(),
                     [&](const T& x) { return std::memcmp(&x, &value, sizeof(T)) == 0; });
}

/// `a` and `b` hold the same bits.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Elements of `buffer` outside `view` (not empty) that no longer hold `value` (bitwise).
template <class T, int R>
std::size_t changed_outside(const StridedView<T, R>& view, const std::vector<T>& buffer, T value) {
  const auto covered = test::covered_mask(view, buffer.data(), buffer.size());
  std::size_t changed = 0;
  for (std::size_t i = 0; i < buffer.size(); ++i)
    if (!covered[i] && std::memcmp(&buffer[i], &value, sizeof(T)) != 0) ++changed;
  return changed;
}

}  // namespace tileattn::fuzz
