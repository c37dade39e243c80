// examples/gqa_sliding_window.cpp: the attention call of a Mistral-style layer: grouped-query
// attention (32 query heads share 8 K/V heads) with a causal sliding window, on a packed
// batch of prompts of different lengths. It checks a few rows against a direct computation.
//
// Mistral 7B uses head_dim 128, 32/8 heads and a 4096-token window; the window here is 256
// so that the short prompts below actually slide.
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int heads_q = 32, heads_kv = 8, head_dim = 128, window = 256;

/// One output row computed the obvious way: softmax over keys j in [i - window, i] of the
/// query's own sequence, using K/V head h / (heads_q / heads_kv).
double max_row_error(const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const std::vector<float>& o, int seq_start,
                     int i, int h) {
  const int kh = h / (heads_q / heads_kv), first = std::max(0, i - window);
  const auto qrow = &q[((seq_start + i) * heads_q + h) * head_dim];
  std::vector<double> p;
  for (int j = first; j <= i; ++j) {
    double dot = 0;
    for (int c = 0; c < head_dim; ++c) dot += qrow[c] * k[((seq_start + j) * heads_kv + kh) * head_dim + c];
    p.push_back(dot / std::sqrt(double(head_dim)));
  }
  const double m = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - m));
  double err = 0;
  for (int c = 0; c < head_dim; ++c) {
    double acc = 0;
    for (int j = first; j <= i; ++j) acc += p[j - first] * v[((seq_start + j) * heads_kv + kh) * head_dim + c];
    err = std::max(err, std::abs(acc / sum - o[((seq_start + i) * heads_q + h) * head_dim + c]));
  }
  return err;
}

}  // namespace

int main() {
  // Three prompts packed back to back, as a server batches them: [total_tokens, heads, d].
  const std::vector<std::int32_t> cu_seqlens{0, 700, 1000, 1900};
  const int total = cu_seqlens.back(), longest = 900;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](std::size_t n) { std::vector<float> x(n); for (float& e : x) e = normal(rng); return x; };
  const auto q = random(std::size_t(total) * heads_q * head_dim);
  const auto k = random(std::size_t(total) * heads_kv * head_dim);
  const auto v = random(std::size_t(total) * heads_kv * head_dim);
  std::vector<float> o(q.size()), lse(std::size_t(heads_q) * total);

  tileattn::ForwardOptions options;
  options.causal = true;          // each token sees itself and earlier tokens...
  options.window_left = window;   // ...at most `window` tokens back
  tileattn::forward_varlen(tileattn::make_thd(q.data(), total, heads_q, head_dim),
                           tileattn::make_thd(k.data(), total, heads_kv, head_dim),
                           tileattn::make_thd(v.data(), total, heads_kv, head_dim),
                           tileattn::make_thd(o.data(), total, heads_q, head_dim),
                           tileattn::make_packed_lse(lse.data(), heads_q, total),
                           tileattn::VarlenSequences{cu_seqlens, cu_seqlens, longest, longest},
                           options);

  double err = 0;
  for (int s = 0; s + 1 < int(cu_seqlens.size()); ++s)
    for (int i : {0, 1, window, cu_seqlens[s + 1] - cu_seqlens[s] - 1})
      for (int h : {0, 3, 4, 31}) err = std::max(err, max_row_error(q, k, v, o, cu_seqlens[s], i, h));
  std::printf("GQA %d/%d heads, causal window %d, %zu prompts: max |O - direct| = %.2e\n", heads_q,
              heads_kv, window, cu_seqlens.size() - 1, err);
  return err < 1e-4 ? 0 : 1;
}
