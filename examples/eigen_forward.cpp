// examples/eigen_forward.cpp: tileattn::forward on Eigen tensors, in place, through
// tileattn/eigen.hpp: the same attention (GQA, causal) in float and in Eigen::bfloat16.
// Tensors are Eigen::Tensor<T, 4, Eigen::RowMajor> with dimensions [batch, seqlen, heads,
// head_dim]; the log-sum-exp is an Eigen::Tensor<float, 3, Eigen::RowMajor> [batch, heads,
// seqlen]. It exits non-zero when the bf16 output strays from the float one.
#include <tileattn/eigen.hpp>
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

int main() {
  constexpr int B = 2, N = 200, H = 8, Hkv = 2, D = 64;
  using Tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
  using Tensor4bf = Eigen::Tensor<Eigen::bfloat16, 4, Eigen::RowMajor>;
  using Lse = Eigen::Tensor<float, 3, Eigen::RowMajor>;
  namespace te = tileattn::eigen;

  // Random N(0, 1) inputs in float, and the same values rounded to bf16.
  Tensor4 q(B, N, H, D), k(B, N, Hkv, D), v(B, N, Hkv, D), o(B, N, H, D);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (Tensor4* t : {&q, &k, &v}) std::generate(t->data(), t->data() + t->size(), [&] { return normal(rng); });
  const Tensor4bf qb = q.cast<Eigen::bfloat16>(), kb = k.cast<Eigen::bfloat16>(), vb = v.cast<Eigen::bfloat16>();
  Tensor4bf ob(B, N, H, D);
  Lse lse(B, H, N), lse_bf(B, H, N);

  tileattn::ForwardOptions options;
  options.causal = true;
  tileattn::forward(te::view(q), te::view(k), te::view(v), te::view(o), te::lse_view(lse), options);
  tileattn::forward(te::view(qb), te::view(kb), te::view(vb), te::view(ob), te::lse_view(lse_bf), options);

  // The bf16 output (as float) against the float one.
  float max_diff = 0;
  for (Eigen::Index i = 0; i < o.size(); ++i)
    max_diff = std::max(max_diff, std::abs(float(ob.data()[i]) - o.data()[i]));
  std::printf("B=%d N=%d heads %d/%d d=%d, causal\n", B, N, H, Hkv, D);
  std::printf("O[0, 5, 0, 0:4]  float: %+.4f %+.4f %+.4f %+.4f\n", o(0, 5, 0, 0), o(0, 5, 0, 1), o(0, 5, 0, 2),
              o(0, 5, 0, 3));
  std::printf("O[0, 5, 0, 0:4]  bf16:  %+.4f %+.4f %+.4f %+.4f\n", float(ob(0, 5, 0, 0)), float(ob(0, 5, 0, 1)),
              float(ob(0, 5, 0, 2)), float(ob(0, 5, 0, 3)));
  std::printf("LSE[1, 7, %d]  float: %.5f  bf16: %.5f\n", N - 1, lse(1, 7, N - 1), lse_bf(1, 7, N - 1));
  std::printf("max |O_bf16 - O_float| = %.2e\n", max_diff);
  return max_diff < 3e-2f ? 0 : 1;
}
