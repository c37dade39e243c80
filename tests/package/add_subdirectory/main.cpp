// tests/package/add_subdirectory/main.cpp: a program built against tileattn::tileattn from
// add_subdirectory; checks forward() on [batch, heads, seqlen, head_dim] buffers against the
// double-precision reference, on every compiled-in backend.
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "reference/naive_attention.hpp"

namespace {

using tileattn::index_t;

// seqlen_q > seqlen_k: under the bottom-right causal mask the first rows see no key at all.
constexpr index_t batch = 1, heads = 2, seqlen_q = 45, seqlen_k = 29, head_dim = 96;
constexpr double tolerance = 1e-4;

// |got - want|, where two infinities of the same sign count as equal.
double difference(double got, double want) {
  if (std::isinf(want) && got == want) return 0.0;
  return std::abs(got - want);
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  auto random_buffer = [&](index_t seqlen) {
    std::vector<float> x(static_cast<std::size_t>(batch * heads * seqlen * head_dim));
    for (float& e : x) e = uniform(rng);
    return x;
  };
  const std::vector<float> q = random_buffer(seqlen_q), k = random_buffer(seqlen_k),
                           v = random_buffer(seqlen_k);
  std::vector<float> o(q.size()), lse(static_cast<std::size_t>(batch * heads * seqlen_q));
  const auto q_view = tileattn::make_bhsd(q.data(), batch, heads, seqlen_q, head_dim);
  const auto k_view = tileattn::make_bhsd(k.data(), batch, heads, seqlen_k, head_dim);
  const auto v_view = tileattn::make_bhsd(v.data(), batch, heads, seqlen_k, head_dim);
  const auto o_view = tileattn::make_bhsd(o.data(), batch, heads, seqlen_q, head_dim);
  const auto lse_view = tileattn::make_lse(lse.data(), batch, heads, seqlen_q);

  bool ok = true;
  for (tileattn::Backend backend : {tileattn::Backend::serial, tileattn::Backend::openmp,
                                    tileattn::Backend::tbb}) {
    if (!tileattn::backend_available(backend)) {
      std::printf("backend %-6s not compiled in\n", tileattn::to_string(backend));
      continue;
    }
    for (bool causal : {false, true}) {
      tileattn::ForwardOptions options;
      options.causal = causal;
      options.softmax_scale = 0.2f;
      options.execution = {backend, 2};
      tileattn::forward(q_view, k_view, v_view, o_view, lse_view, options);
      const auto want = tileattn::reference::attention<float>(q_view, k_view, v_view, 0.2, causal);
      double o_error = 0.0, lse_error = 0.0;
      for (index_t b = 0; b < batch; ++b)
        for (index_t h = 0; h < heads; ++h)
          for (index_t i = 0; i < seqlen_q; ++i) {
            lse_error = std::max(lse_error, difference(lse_view(b, h, i), want.log_sum_exp(b, h, i)));
            for (index_t d = 0; d < head_dim; ++d)
              o_error = std::max(o_error, difference(o_view(b, i, h, d), want.out(b, i, h, d)));
          }
      const bool pass = o_error <= tolerance && lse_error <= tolerance;
      std::printf("backend %-6s causal=%d  max |O - ref| = %.2e  max |LSE - ref| = %.2e  %s\n",
                  tileattn::to_string(backend), int(causal), o_error, lse_error,
                  pass ? "ok" : "MISMATCH");
      ok = ok && pass;
    }
  }
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
