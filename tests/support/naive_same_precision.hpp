// tests/support/naive_same_precision.hpp: standard attention computed the way a plain
// implementation in the storage type computes it (S and P rounded to T, fp32 sums): the
// "naive implementation in the same precision" of FlashAttention's accuracy rule, which
// the reduced-precision tests bound the kernels' error by (2x for the forward).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/naive_attention.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {

/// Standard attention the way a plain T implementation computes it (see the file comment):
/// q, k, v hold values of T (as floats); every option follows reference::attention's
/// semantics (same order, same masks, same sink and ALiBi conventions), in fp32. Rows that
/// see no key get O = 0 and LSE = -std::numeric_limits<float>::infinity() (or the sink's logit when there is one, as the
/// reference). O values are rounded to T.
template <storage_type T>
void naive_same_precision(const TensorView<const float>& q, const TensorView<const float>& k,
                          const TensorView<const float>& v, const reference::Options& opt,
                          const TensorView<float>& o, const LseView& lse) {
  const index_t B = q.shape[0], nq = q.shape[1], H = q.shape[2], d = q.shape[3];
  const index_t nk = k.shape[1], dv = v.shape[3], group = H / k.shape[2];
  const index_t offset = opt.diagonal(nq, nk);
  const index_t right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  const float scale = opt.softmax_scale ? static_cast<float>(*opt.softmax_scale)
                                        : 1.0f / std::sqrt(static_cast<float>(d));
  const auto round = [](float x) { return to_float(from_float<T>(x)); };
  std::vector<float> s(static_cast<std::size_t>(nk)), acc(static_cast<std::size_t>(dv));
  for (index_t b = 0; b < B; ++b) {
    const index_t bb = opt.batch_index >= 0 ? opt.batch_index : b;
    for (index_t h = 0; h < H; ++h) {
      const index_t kh = h / group;
      const float sink = opt.sinks.empty() ? -std::numeric_limits<float>::infinity() : opt.sinks[static_cast<std::size_t>(h)];
      for (index_t i = 0; i < nq; ++i) {
        float m = sink;
        const reference::detail::HeadVector qi(q, b, i, h);
        for (index_t j = 0; j < nk; ++j) {
          const reference::detail::HeadVector kj(k, b, j, kh);
          float dot = 0.0f;
          for (index_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
          float x = round(dot * scale);  // S stored in T, as a T matmul returns it
          if (opt.softcap > 0) x = opt.softcap * std::tanh(x / opt.softcap);
          const bool outside = reference::outside_window(opt, i, offset, j, left, right) ||
                               (opt.mask.data && !reference::detail::broadcast_at(opt.mask, bb, h, i, j));
          if (opt.bias.data) x += static_cast<float>(reference::detail::broadcast_at(opt.bias, bb, h, i, j));
          if (!opt.alibi_slopes.empty()) {
            const bool per_batch = static_cast<index_t>(opt.alibi_slopes.size()) != H;
            const float slope = opt.alibi_slopes[static_cast<std::size_t>((per_batch ? bb * H : 0) + h)];
            x -= slope * static_cast<float>(std::abs(i + offset - j));
          }
          s[static_cast<std::size_t>(j)] = outside ? -std::numeric_limits<float>::infinity() : x;
          m = std::max(m, s[static_cast<std::size_t>(j)]);
        }
        if (m == -std::numeric_limits<float>::infinity()) {
          for (index_t c = 0; c < dv; ++c) o(b, i, h, c) = 0.0f;
          lse(b, h, i) = -std::numeric_limits<float>::infinity();
          continue;
        }
        float sum = sink == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(sink - m);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (index_t j = 0; j < nk; ++j) {
          const float sj = s[static_cast<std::size_t>(j)];
          if (sj == -std::numeric_limits<float>::infinity()) continue;
          const float p = std::exp(sj - m);
          sum += p;
          const float p_t = round(p * static_cast<float>(reference::dropout_factor(opt.dropout, bb, H, h, i, j)));  // P (dropped) in T for P V
          const reference::detail::HeadVector vj(v, b, j, kh);
          for (index_t c = 0; c < dv; ++c) acc[static_cast<std::size_t>(c)] += p_t * vj[c];
        }
        for (index_t c = 0; c < dv; ++c) o(b, i, h, c) = round(acc[static_cast<std::size_t>(c)] / sum);
        lse(b, h, i) = m + std::log(sum);
      }
    }
  }
}

}  // namespace tileattn::test
