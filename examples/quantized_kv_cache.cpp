// examples/quantized_kv_cache.cpp: one decode step over a KV cache stored in bf16, int8,
// fp8 e4m3, fp8 e5m2 and the 4-bit blocks q4_0, MXFP4 and NVFP4, from the same bf16 model
// rows: what each format costs in memory and in accuracy.
//
//   tileattn::KvCache<std::int8_t> cache({.num_layers = L, .num_pages = P, .page_size = 16,
//                                          .heads_kv = Hkv, .head_dim = D});
//   cache.append(seq, k_rows, v_rows);                // bf16 rows, quantized on write
//   tileattn::PagedOptions options;
//   options.k_scale = cache.k_scales(layer);          // per (page, K/V head) for int8
//   options.v_scale = cache.v_scales(layer);
//   tileattn::forward_paged(q, cache.k_pages(layer), cache.v_pages(layer), table, seqlens, o, options);
//
// A 4-bit cache (tileattn::KvCache<tileattn::q4_0_block>, mxfp4_block, nvfp4_block) keeps
// each block's scale inside the block: no scale options, the pools index blocks of 32 (16)
// values, and cache.k_pages(layer)(page, row, head, block) is one block
// (tileattn::dequantize_block turns it into its values).
//
// For each format it prints the bytes one token takes per layer (K and V, scales included)
// and two errors of O, as a fraction of the largest |O|: against attention in double over
// the original rows (the quantization error itself), and against attention in double over
// the cache's own dequantized contents (the kernel's error: bf16 output rounding). Exits
// non-zero if either exceeds its stated bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace {

constexpr tileattn::index_t batch = 2, tokens = 500, heads_q = 8, heads_kv = 2, head_dim = 128, page_size = 16;

/// softmax(q k^T / sqrt(d)) v in double for one (sequence, query head): k, v [tokens, heads_kv, d].
std::vector<double> attention(const float* q, const std::vector<float>& k, const std::vector<float>& v,
                              tileattn::index_t kv_head) {
  std::vector<double> s(tokens), out(head_dim, 0.0);
  double m = -INFINITY, l = 0;
  for (tileattn::index_t j = 0; j < tokens; ++j) {
    double dot = 0;
    for (tileattn::index_t c = 0; c < head_dim; ++c) dot += double(q[c]) * k[(j * heads_kv + kv_head) * head_dim + c];
    s[j] = dot / std::sqrt(double(head_dim));
    m = std::max(m, s[j]);
  }
  for (tileattn::index_t j = 0; j < tokens; ++j) l += (s[j] = std::exp(s[j] - m));
  for (tileattn::index_t j = 0; j < tokens; ++j)
    for (tileattn::index_t c = 0; c < head_dim; ++c) out[c] += s[j] / l * v[(j * heads_kv + kv_head) * head_dim + c];
  return out;
}

struct Inputs {
  std::vector<tileattn::bf16> k, v, q;  // [batch, tokens, heads_kv, d] and [batch, 1, heads_q, d]
};

/// Appends every sequence's rows to a fresh cache of type KV, runs one decode step, checks it.
template <class KV>
bool run(const char* name, const Inputs& in) {
  const tileattn::index_t pages = batch * ((tokens + page_size - 1) / page_size);
  tileattn::KvCache<KV> cache({.num_layers = 1, .num_pages = pages, .page_size = page_size, .heads_kv = heads_kv,
                               .head_dim = head_dim});
  std::vector<tileattn::SequenceId> seqs;
  for (tileattn::index_t b = 0; b < batch; ++b) {
    seqs.push_back(cache.create());
    const auto rows = [&](const std::vector<tileattn::bf16>& x) {
      return tileattn::make_bshd(x.data() + b * tokens * heads_kv * head_dim, 1, tokens, heads_kv, head_dim);
    };
    cache.append(seqs.back(), rows(in.k), rows(in.v));
  }
  const auto tables = cache.batch(seqs);
  std::vector<tileattn::bf16> o(in.q.size());
  tileattn::PagedOptions options;
  if constexpr (tileattn::quantized_type<KV>) {
    options.k_scale = cache.k_scales(0);
    options.v_scale = cache.v_scales(0);
  }
  tileattn::forward_paged(tileattn::make_bshd(in.q.data(), batch, 1, heads_q, head_dim), cache.k_pages(0),
                          cache.v_pages(0), tables.block_table_view(), tables.seqlens(),
                          tileattn::make_bshd(o.data(), batch, 1, heads_q, head_dim), options);

  double quantization = 0, kernel = 0, largest = 0;
  for (tileattn::index_t b = 0; b < batch; ++b) {
    std::vector<float> k0, v0, kd, vd, q;  // original rows, the cache's dequantized rows, queries
    for (tileattn::index_t t = 0; t < tokens; ++t)
      for (tileattn::index_t h = 0; h < heads_kv; ++h) {
        const std::int32_t page = cache.pages(seqs[b])[t / page_size];
        float ks = 1.0f, vs = 1.0f;
        if constexpr (tileattn::quantized_type<KV>) {
          ks = options.k_scale(tileattn::adaptive_scale<KV> ? page : 0, h);
          vs = options.v_scale(tileattn::adaptive_scale<KV> ? page : 0, h);
        }
        for (tileattn::index_t c = 0; c < head_dim; ++c) {
          const auto at = ((b * tokens + t) * heads_kv + h) * head_dim + c;
          k0.push_back(tileattn::to_float(in.k[at]));
          v0.push_back(tileattn::to_float(in.v[at]));
          if constexpr (!tileattn::block_quantized_type<KV>) {
            kd.push_back(tileattn::to_float(cache.k_pages(0)(page, t % page_size, h, c)) * ks);
            vd.push_back(tileattn::to_float(cache.v_pages(0)(page, t % page_size, h, c)) * vs);
          }
        }
        if constexpr (tileattn::block_quantized_type<KV>) {  // a block at a time
          float values[KV::values];
          for (tileattn::index_t c = 0; c < head_dim / KV::values; ++c) {
            tileattn::dequantize_block(cache.k_pages(0)(page, t % page_size, h, c), values);
            kd.insert(kd.end(), values, values + KV::values);
            tileattn::dequantize_block(cache.v_pages(0)(page, t % page_size, h, c), values);
            vd.insert(vd.end(), values, values + KV::values);
          }
        }
      }
    for (tileattn::index_t h = 0; h < heads_q; ++h) {
      q.assign(head_dim, 0.0f);
      for (tileattn::index_t c = 0; c < head_dim; ++c) q[c] = tileattn::to_float(in.q[(b * heads_q + h) * head_dim + c]);
      const auto exact = attention(q.data(), k0, v0, h / (heads_q / heads_kv));
      const auto over_cache = attention(q.data(), kd, vd, h / (heads_q / heads_kv));
      for (tileattn::index_t c = 0; c < head_dim; ++c) {
        const double got = tileattn::to_float(o[(b * heads_q + h) * head_dim + c]);
        largest = std::max(largest, std::abs(exact[c]));
        quantization = std::max(quantization, std::abs(over_cache[c] - exact[c]));
        kernel = std::max(kernel, std::abs(got - over_cache[c]));
      }
    }
  }
  // Bytes per token per layer: K and V rows, and int8's per-(page, head) scales spread over a page.
  const double scale_bytes = tileattn::adaptive_scale<KV> ? 2.0 * heads_kv * sizeof(float) / page_size : 0.0;
  const double bytes = 2.0 * heads_kv * head_dim / tileattn::values_per_element<KV> * sizeof(KV) + scale_bytes;
  // Bounds, with ~1.5x margin over what this seed measures: int8 keeps ~8 significant bits
  // of a page's range, e4m3 4, e5m2 3 (each error about half a unit of the last one), the
  // 4-bit blocks 2 to 3 bits of their block's range.
  const double quantization_bound = tileattn::block_quantized_type<KV>             ? 0.35
                                    : std::is_same_v<KV, tileattn::fp8_e5m2>   ? 0.12
                                    : std::is_same_v<KV, tileattn::fp8_e4m3> ? 0.06
                                                                             : 0.02;
  const bool ok = quantization / largest <= quantization_bound && kernel / largest <= 4e-3;
  std::printf("%-9s %7.1f bytes/token/layer   quantization error %.2e   kernel error %.2e   (max |O| %.3f)  %s\n",
              name, bytes, quantization / largest, kernel / largest, largest, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal;
  Inputs in;
  for (auto* x : {&in.k, &in.v}) {
    x->resize(batch * tokens * heads_kv * head_dim);
    for (auto& e : *x) e = tileattn::bf16(normal(rng));
  }
  in.q.resize(batch * heads_q * head_dim);
  for (auto& e : in.q) e = tileattn::bf16(normal(rng));
  std::printf("decode step: B %lld, %lld cached tokens, %lld/%lld heads, d %lld; errors relative to max |O|\n",
              (long long)batch, (long long)tokens, (long long)heads_q, (long long)heads_kv, (long long)head_dim);
  bool ok = run<tileattn::bf16>("bf16", in);
  ok &= run<std::int8_t>("int8", in);
  ok &= run<tileattn::fp8_e4m3>("fp8_e4m3", in);
  ok &= run<tileattn::fp8_e5m2>("fp8_e5m2", in);
  ok &= run<tileattn::q4_0_block>("q4_0", in);
  ok &= run<tileattn::mxfp4_block>("mxfp4", in);
  ok &= run<tileattn::nvfp4_block>("nvfp4", in);
  return ok ? 0 : 1;
}
