// examples/mla_decode.cpp: absorbed multi-head latent attention (MLA, DeepSeek V2/V3) decode
// steps over a paged latent cache: what a DeepSeek layer does per token, at toy sizes.
//
//   tileattn::KvCache<tileattn::bf16> cache({.num_layers = L, .num_pages = P, .page_size = 64,
//       .heads_kv = 1, .head_dim = rank + rope, .head_dim_v = rank, .latent = true});
//   cache.extend(seq, 1);
//   cache.write_latent(layer, seq, latent_row);      // [1, 1, rank + rope]: c_kv, then k_pe (rotated)
//   // q_abs[h] = [W_UK[h]^T q_nope[h], q_pe[h]]: the key up-projection absorbed into the query
//   tileattn::forward_paged_mla(q_abs, cache.k_pages(layer), table, seqlens, o_latent, options);
//   // o[h] = W_UV[h] o_latent[h]: the value up-projection after attention
//
// MLA caches one latent row per token, c_kv (kv_lora_rank values) and the rotary key part k_pe,
// shared by every query head. Head h's key is [W_UK[h] c_kv, k_pe] and its value W_UV[h] c_kv,
// so q . k = (W_UK[h]^T q_nope) . c_kv + q_pe . k_pe and sum_t p_t v_t = W_UV[h] sum_t p_t c_kv_t:
// with the up-projections moved onto the query and the output ("absorbed"), every head attends
// the latent rows themselves, K = the whole row, V = its first kv_lora_rank columns, and a
// latent page is read once for all heads. The softmax scale stays the model's,
// 1 / sqrt(qk_nope_dim + rope_dim), not the latent's width.
//
// Rotary: DeepSeek rotates q_pe and k_pe (the rows' last dims); RotaryOptions rotates a row's
// first dims, so the caller rotates them before the write and the call (here: random rows
// stand for rotated ones). Checks every step's output against the unabsorbed computation
// (per-head K and V materialized) in double; exits non-zero past bf16's bound.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace {

using tileattn::index_t;
// DeepSeek V3: heads 128, kv_lora_rank 512, qk_nope 128, rope 64, v_head 128. Here, smaller.
constexpr index_t heads = 16, rank = 64, rope = 16, nope = 32, v_dim = 32, page_size = 64;
constexpr index_t prompt = 300, steps = 4, latent_dim = rank + rope;

std::vector<float> random_vector(std::mt19937& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

/// Rounds to bf16 and back: the values the bf16 cache and queries hold.
std::vector<tileattn::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<tileattn::bf16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = tileattn::from_float<tileattn::bf16>(x[i]);
  return out;
}
float rounded(float x) { return tileattn::to_float(tileattn::from_float<tileattn::bf16>(x)); }

}  // namespace

int main() {
  std::mt19937 rng(33);
  const auto w_uk = random_vector(rng, heads * nope * rank, 0.15f);  // [h, nope, rank]
  const auto w_uv = random_vector(rng, heads * v_dim * rank, 0.15f);  // [h, v_dim, rank]
  const float scale = 1.0f / std::sqrt(static_cast<float>(nope + rope));

  tileattn::KvCache<tileattn::bf16> cache({.num_layers = 1, .num_pages = 16, .page_size = page_size, .heads_kv = 1,
                                           .head_dim = latent_dim, .head_dim_v = rank, .latent = true});
  const tileattn::SequenceId seq = cache.create();
  std::vector<float> latents = random_vector(rng, prompt * latent_dim, 1.0f);  // [t, rank + rope], as stored
  for (float& x : latents) x = rounded(x);
  cache.append_latent(seq, tileattn::make_bshd<const tileattn::bf16>(to_bf16(latents).data(), 1, prompt, 1, latent_dim));

  double worst = 0.0;
  for (index_t step = 0; step < steps; ++step) {
    // The new token's latent row: extend, then write it (a model writes it after projecting).
    std::vector<float> row = random_vector(rng, latent_dim, 1.0f);
    for (float& x : row) x = rounded(x);
    latents.insert(latents.end(), row.begin(), row.end());
    cache.extend(seq, 1);
    const auto row_bf16 = to_bf16(row);
    cache.write_latent(0, seq, tileattn::StridedView<const tileattn::bf16, 3>{row_bf16.data(), {1, 1, latent_dim},
                                                                             {latent_dim, latent_dim, 1}});
    const index_t n = cache.length(seq);

    // The query: q_nope and q_pe per head; absorbed: q_abs[h] = [W_UK[h]^T q_nope[h], q_pe[h]].
    const auto q_nope = random_vector(rng, heads * nope, 1.0f), q_pe = random_vector(rng, heads * rope, 1.0f);
    std::vector<float> q_abs(heads * latent_dim);
    for (index_t h = 0; h < heads; ++h) {
      for (index_t c = 0; c < rank; ++c) {
        float acc = 0.0f;
        for (index_t i = 0; i < nope; ++i) acc += w_uk[(h * nope + i) * rank + c] * q_nope[h * nope + i];
        q_abs[h * latent_dim + c] = acc;
      }
      for (index_t i = 0; i < rope; ++i) q_abs[h * latent_dim + rank + i] = q_pe[h * rope + i];
    }
    const auto q_bf16 = to_bf16(q_abs);
    std::vector<tileattn::bf16> o_latent(heads * rank);
    const std::vector<tileattn::SequenceId> ids{seq};
    const auto tables = cache.batch(ids);
    tileattn::PagedOptions options;
    options.softmax_scale = scale;
    tileattn::forward_paged_mla(tileattn::make_bshd<const tileattn::bf16>(q_bf16.data(), 1, 1, heads, latent_dim),
                                cache.k_pages(0), tables.block_table_view(), tables.seqlens(),
                                tileattn::make_bshd(o_latent.data(), 1, 1, heads, rank), options);

    // o[h] = W_UV[h] o_latent[h], against the unabsorbed attention in double.
    double largest = 0.0, error = 0.0;
    for (index_t h = 0; h < heads; ++h) {
      std::vector<double> s(n), v_out(v_dim, 0.0);
      double m = -INFINITY, l = 0.0;
      for (index_t t = 0; t < n; ++t) {
        const float* c_kv = &latents[t * latent_dim];
        double dot = 0.0;
        for (index_t i = 0; i < nope; ++i) {  // q_nope . (W_UK[h] c_kv): head h's key
          double k = 0.0;
          for (index_t c = 0; c < rank; ++c) k += double(w_uk[(h * nope + i) * rank + c]) * c_kv[c];
          dot += double(q_nope[h * nope + i]) * k;
        }
        for (index_t i = 0; i < rope; ++i) dot += double(q_pe[h * rope + i]) * c_kv[rank + i];
        m = std::max(m, s[t] = dot * scale);
      }
      for (index_t t = 0; t < n; ++t) l += (s[t] = std::exp(s[t] - m));
      for (index_t t = 0; t < n; ++t)
        for (index_t j = 0; j < v_dim; ++j) {  // head h's value: W_UV[h] c_kv
          double v = 0.0;
          for (index_t c = 0; c < rank; ++c) v += double(w_uv[(h * v_dim + j) * rank + c]) * latents[t * latent_dim + c];
          v_out[j] += s[t] / l * v;
        }
      for (index_t j = 0; j < v_dim; ++j) {
        double o = 0.0;
        for (index_t c = 0; c < rank; ++c) o += double(w_uv[(h * v_dim + j) * rank + c]) * tileattn::to_float(o_latent[h * rank + c]);
        largest = std::max(largest, std::abs(v_out[j]));
        error = std::max(error, std::abs(o - v_out[j]));
      }
    }
    worst = std::max(worst, error / largest);
    std::printf("step %td: %td keys, max |o - unabsorbed| / max |o| = %.2e\n", step, n, error / largest);
  }
  // bf16 queries (the absorbed q rounded) and bf16 outputs: a few parts in a thousand.
  const bool ok = worst < 1e-2;
  std::printf("%s (bound 1e-2)\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
