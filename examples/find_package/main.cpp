// examples/find_package/main.cpp: runs tileattn::forward on a small random problem and checks it
// against a naive fp64 softmax attention written out below; exits non-zero on a mismatch.
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

namespace {

using tileattn::index_t;

// Sizes deliberately not multiples of any tile size; seqlen_q < seqlen_k so that every
// causal row (bottom-right aligned) sees at least one key.
constexpr index_t batch = 2, seqlen_q = 37, seqlen_k = 53, heads = 3, head_dim = 64;
constexpr double tolerance = 1e-4;

// Element (b, s, h, d) of a contiguous [batch, seqlen, heads, head_dim] buffer.
index_t bshd(index_t b, index_t s, index_t h, index_t d, index_t seqlen) {
  return ((b * seqlen + s) * heads + h) * head_dim + d;
}

struct Reference {
  std::vector<double> o;    // [batch, seqlen_q, heads, head_dim]
  std::vector<double> lse;  // [batch, heads, seqlen_q]
};

// softmax(scale * Q K^T) V in double, one query row at a time. Causal: query i sees key j
// iff j <= i + seqlen_k - seqlen_q.
Reference naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, double scale, bool causal) {
  Reference r{std::vector<double>(q.size(), 0.0),
              std::vector<double>(static_cast<std::size_t>(batch * heads * seqlen_q), 0.0)};
  std::vector<double> scores(static_cast<std::size_t>(seqlen_k));
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < seqlen_q; ++i) {
        const index_t visible = causal ? std::min(seqlen_k, i + seqlen_k - seqlen_q + 1) : seqlen_k;
        double max_score = -std::numeric_limits<double>::infinity();
        for (index_t j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (index_t d = 0; d < head_dim; ++d)
            dot += double(q[bshd(b, i, h, d, seqlen_q)]) * double(k[bshd(b, j, h, d, seqlen_k)]);
          scores[j] = scale * dot;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (index_t j = 0; j < visible; ++j) sum += std::exp(scores[j] - max_score);
        for (index_t j = 0; j < visible; ++j) {
          const double p = std::exp(scores[j] - max_score) / sum;
          for (index_t d = 0; d < head_dim; ++d)
            r.o[bshd(b, i, h, d, seqlen_q)] += p * double(v[bshd(b, j, h, d, seqlen_k)]);
        }
        r.lse[(b * heads + h) * seqlen_q + i] = max_score + std::log(sum);
      }
  return r;
}

double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  return worst;
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random_buffer = [&](index_t seqlen) {
    std::vector<float> x(static_cast<std::size_t>(batch * seqlen * heads * head_dim));
    for (float& e : x) e = uniform(rng);
    return x;
  };
  const std::vector<float> q = random_buffer(seqlen_q), k = random_buffer(seqlen_k),
                           v = random_buffer(seqlen_k);
  std::vector<float> o(q.size()), lse(static_cast<std::size_t>(batch * heads * seqlen_q));

  std::printf("tileattn %s\n", tileattn::version);
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
      options.execution.backend = backend;
      tileattn::forward(tileattn::make_bshd(q.data(), batch, seqlen_q, heads, head_dim),
                        tileattn::make_bshd(k.data(), batch, seqlen_k, heads, head_dim),
                        tileattn::make_bshd(v.data(), batch, seqlen_k, heads, head_dim),
                        tileattn::make_bshd(o.data(), batch, seqlen_q, heads, head_dim),
                        tileattn::make_lse(lse.data(), batch, heads, seqlen_q), options);
      const Reference want = naive_attention(q, k, v, 1.0 / std::sqrt(double(head_dim)), causal);
      const double o_error = max_abs_diff(o, want.o), lse_error = max_abs_diff(lse, want.lse);
      const bool pass = o_error <= tolerance && lse_error <= tolerance;
      std::printf("backend %-6s causal=%d  max |O - ref| = %.2e  max |LSE - ref| = %.2e  %s\n",
                  tileattn::to_string(backend), int(causal), o_error, lse_error,
                  pass ? "ok" : "MISMATCH");
      ok = ok && pass;
    }
  }
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
