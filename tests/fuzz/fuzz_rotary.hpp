// tests/fuzz/fuzz_rotary.hpp: what the harnesses share about rotary embedding (RotaryOptions):
// random tables drawn from the input (sizes, both table layouts, both pair layouts, now and
// then a NaN entry) and the reference rotation of one row, written out from the definition in
// double and rounded as the library rounds it (to float, then to the rotated tensor's type).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace tileattn::fuzz {

/// Tables of `rows` positions and `half` columns (cos and sin of random angles, now and then
/// a NaN), in two arrays or in vLLM's cos_sin_cache layout (one buffer, strided views).
struct RotaryTables {
  std::vector<float> data;
  RotaryOptions options{};
  bool fused = false;

  std::string describe() const {
    if (!options.enabled()) return "none";
    return std::to_string(options.cos.shape[0]) + " x " + std::to_string(options.cos.shape[1]) +
           (options.interleaved ? " interleaved" : " neox") + (fused ? " cos_sin_cache" : "");
  }
};

inline RotaryTables make_rotary_tables(FuzzedDataProvider& in, std::mt19937& rng, index_t rows, index_t half,
                                       bool allow_nan = true) {
  RotaryTables t;
  t.fused = in.ConsumeBool();
  const bool poison = allow_nan && in.ConsumeIntegralInRange(0, 15) == 0;
  t.data.resize(static_cast<std::size_t>(2 * rows * half));
  std::uniform_real_distribution<double> angle(-20.0, 20.0);
  for (index_t p = 0; p < rows; ++p)
    for (index_t c = 0; c < half; ++c) {
      const double a = angle(rng);
      const auto at = static_cast<std::size_t>(t.fused ? p * 2 * half + c : p * half + c);
      const auto sin_at = t.fused ? at + static_cast<std::size_t>(half) : at + static_cast<std::size_t>(rows * half);
      t.data[at] = static_cast<float>(std::cos(a));
      t.data[sin_at] = static_cast<float>(std::sin(a));
    }
  if (poison && !t.data.empty()) t.data[rng() % t.data.size()] = std::numeric_limits<float>::quiet_NaN();
  const index_t ld = t.fused ? 2 * half : half;
  const float* sin = t.fused ? t.data.data() + half : t.data.data() + rows * half;
  t.options = {{t.data.data(), {rows, half}, {ld, 1}}, {sin, {rows, half}, {ld, 1}}, in.ConsumeBool()};
  return t;
}

/// row[0, rotary_dim) rotated at `position` in double, each value rounded to float and then
/// to T (as T stores it): the values the library's rotated row holds.
template <class T>
void rotate_reference(const RotaryOptions& r, float* row, index_t position) {
  const index_t half = r.cos.shape[1];
  for (index_t c = 0; c < half; ++c) {
    const index_t a = r.interleaved ? 2 * c : c, b = r.interleaved ? 2 * c + 1 : c + half;
    const double x1 = row[a], x2 = row[b], cs = r.cos(position, c), sn = r.sin(position, c);
    row[a] = to_float(from_float<T>(static_cast<float>(x1 * cs - x2 * sn)));
    row[b] = to_float(from_float<T>(static_cast<float>(x1 * sn + x2 * cs)));
  }
}

}  // namespace tileattn::fuzz
