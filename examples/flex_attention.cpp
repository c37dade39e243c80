// examples/flex_attention.cpp: flexible attention (PyTorch FlexAttention's semantics) with
// your own functors: a custom mask_mod (prefix-LM: the first `prefix` tokens are seen by
// every query, the rest causally) and a custom score_mod (a per-head penalty that grows with
// the query-key distance, ALiBi-like), paired with its derivative for the backward. A block
// mask is built once; forward_flex and backward_flex run with it. Sampled rows of O, the LSE
// and dQ are checked against a direct computation in double; exit code 1 on FAIL.
//
// A mask_mod is bool(b, h, q_idx, kv_idx); a score_mod is float(score, b, h, q_idx, kv_idx)
// with score = softmax_scale * q.k (natural-log units). docs/flex.md has the details.
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using tileattn::index_t;

namespace {

constexpr index_t B = 1, H = 4, N = 1024, D = 64, prefix = 256;

/// One row of O, the LSE and dQ computed the obvious way, in double, from the same mods;
/// returns the largest error of the library's row against it (dQ relative to its size).
template <class Mask, class Score>
double row_error(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                 const std::vector<float>& dout, const std::vector<float>& o, const std::vector<float>& lse,
                 const std::vector<float>& dq, const Mask& mask, const Score& score_mod, index_t i, index_t h) {
  const auto at = [&](const std::vector<float>& x, index_t pos, index_t c) { return double(x[(pos * H + h) * D + c]); };
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(N, -INFINITY);
  for (index_t j = 0; j < N; ++j) {
    if (!mask(0, h, i, j)) continue;
    double dot = 0;
    for (index_t c = 0; c < D; ++c) dot += at(q, i, c) * at(k, j, c);
    s[j] = score_mod(float(scale * dot), 0, h, i, j);  // the user's functor, as the kernel calls it
  }
  const double m = *std::max_element(s.begin(), s.end());
  double l = 0;
  for (double x : s) l += std::exp(x - m);
  const double ref_lse = m + std::log(l);
  double err = std::abs(ref_lse - lse[h * N + i]);
  std::vector<double> out(D, 0.0), dp(N, 0.0);
  for (index_t j = 0; j < N; ++j)
    for (index_t c = 0; c < D; ++c) out[c] += std::exp(s[j] - ref_lse) * at(v, j, c);
  double delta = 0;  // D_i = dO_i . O_i
  for (index_t c = 0; c < D; ++c) {
    err = std::max(err, std::abs(out[c] - at(o, i, c)));
    delta += at(dout, i, c) * out[c];
  }
  // dQ_i = sum_j P_ij (dP_ij - D_i) * score_mod'(x_ij) * scale * k_j, dP_ij = dO_i . v_j
  std::vector<double> ref_dq(D, 0.0);
  for (index_t j = 0; j < N; ++j) {
    if (s[j] == -INFINITY) continue;
    double dpj = 0, dot = 0;
    for (index_t c = 0; c < D; ++c) dpj += at(dout, i, c) * at(v, j, c), dot += at(q, i, c) * at(k, j, c);
    const double ds = std::exp(s[j] - ref_lse) * (dpj - delta) * score_mod.grad(float(scale * dot), 0, h, i, j);
    for (index_t c = 0; c < D; ++c) ref_dq[c] += ds * scale * at(k, j, c);
  }
  const double dq_size = std::max(1.0, std::abs(*std::max_element(ref_dq.begin(), ref_dq.end(),
                                                                  [](double a, double b) { return std::abs(a) < std::abs(b); })));
  for (index_t c = 0; c < D; ++c) err = std::max(err, std::abs(ref_dq[c] - at(dq, i, c)) / dq_size);
  return err;
}

}  // namespace

int main() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  auto random = [&] { std::vector<float> x(std::size_t(B * N * H * D)); for (float& e : x) e = normal(rng); return x; };
  const auto q = random(), k = random(), v = random(), dout = random();
  std::vector<float> o(q.size()), dq(q.size()), dk(q.size()), dv(q.size()), lse(std::size_t(B * H * N));
  std::vector<float> slope(H);
  for (index_t h = 0; h < H; ++h) slope[h] = std::exp2(-8.0f * float(h + 1) / float(H));  // ALiBi's slopes

  // The mods: a few lines each.
  auto prefix_lm = [](index_t, index_t, index_t q_idx, index_t kv_idx) { return kv_idx < prefix || kv_idx <= q_idx; };
  auto penalty = tileattn::flex::with_grad{
      [&](float score, index_t, index_t h, index_t q_idx, index_t kv_idx) {
        return score - slope[h] * float(q_idx > kv_idx ? q_idx - kv_idx : kv_idx - q_idx);
      },
      [](float, index_t, index_t, index_t, index_t) { return 1.0f; }};  // d score_mod / d score

  // Built once (B, H = 1: shared by every sequence and head), reused by every call.
  const auto blocks = tileattn::create_block_mask(prefix_lm, 1, 1, N, N);
  std::printf("block mask: %ld x %ld blocks of 128, density %.3f (%ld full, %ld partial, %ld empty)\n",
              long(blocks.q_blocks()), long(blocks.kv_blocks()), blocks.density(),
              long(blocks.count(tileattn::BlockKind::full)), long(blocks.count(tileattn::BlockKind::partial)),
              long(blocks.count(tileattn::BlockKind::empty)));

  const auto in = [](const std::vector<float>& x) { return tileattn::make_bshd(x.data(), B, N, H, D); };
  const auto out = [](std::vector<float>& x) { return tileattn::make_bshd(x.data(), B, N, H, D); };
  const tileattn::LseView lse_view = tileattn::make_lse(lse.data(), B, H, N);
  tileattn::forward_flex(in(q), in(k), in(v), out(o), lse_view, penalty, blocks);
  tileattn::backward_flex(in(q), in(k), in(v), in(o), lse_view, in(dout), out(dq), out(dk), out(dv), penalty, blocks);

  // The derivative must match the function: a central difference at a few points.
  double grad_err = 0;
  for (float score : {-3.0f, 0.5f, 4.0f})
    for (index_t h = 0; h < H; ++h) {
      const float step = 1e-2f;
      const index_t i = 300, j = 40;
      const double diff = (penalty(score + step, 0, h, i, j) - penalty(score - step, 0, h, i, j)) / (2.0 * step);
      grad_err = std::max(grad_err, std::abs(diff - penalty.grad(score, 0, h, i, j)));
    }

  double err = 0;
  for (index_t i : {index_t(0), index_t(1), prefix - 1, prefix, index_t(700), N - 1})
    for (index_t h : {index_t(0), H - 1}) err = std::max(err, row_error(q, k, v, dout, o, lse, dq, prefix_lm, penalty, i, h));
  const bool pass = err < 1e-4 && grad_err < 1e-2;
  std::printf("prefix-LM (prefix %ld) with a per-head distance penalty, N %ld, %ld heads of %ld: "
              "max error of O, LSE and dQ against double = %.2e, of the score_mod's grad against a "
              "central difference = %.1e: %s\n",
              long(prefix), long(N), long(H), long(D), err, grad_err, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
