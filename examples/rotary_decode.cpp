// examples/rotary_decode.cpp: rotary position embedding (RoPE) fused into a paged KV cache's
// writes and into forward_paged's Q load, as FlashAttention's flash_attn_with_kvcache does
// with rotary_cos / rotary_sin: K is rotated as KvCache::append / write store it (at each
// token's position in its sequence), Q as the kernel loads it (query i of a sequence with
// q_len new tokens and cache_seqlens keys at position cache_seqlens - q_len + i). No separate
// pass over K and Q.
//
// The tables are the caller's: here Llama 3's (base 500000, frequencies scaled for a longer
// context), [max_position, rotary_dim / 2] floats each; rotary_dim 64 of head_dim 128 rotate
// (GPT-NeoX pairs (x[c], x[c + 32])), the rest pass through. Any base or scaling (YaRN, NTK)
// is only other tables.
//
// Two sequences: prompts of 37 and 5 tokens appended at once, then 6 decode steps (extend,
// write the new token's K/V, attend). Self-check: the same steps with K and Q rotated first by
// tileattn::apply_rotary (the unfused pass, same arithmetic) must give the same bits, and O
// must match a naive double-precision attention over the rotated rows within 1e-4; main()
// returns 1 otherwise.
//
//   cmake --build build -j2 --target rotary_decode && ./build/examples/rotary_decode
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <vector>

namespace {

using tileattn::index_t;
constexpr index_t heads_q = 8, heads_kv = 2, head_dim = 128, rotary_dim = 64, max_position = 1024;

/// Llama 3's RoPE tables: inverse frequencies base^(-2c / rotary_dim), those of wavelengths
/// above original_context / low_freq_factor divided by `factor`, a smooth blend in between.
void llama3_tables(std::vector<float>& cos, std::vector<float>& sin) {
  constexpr double base = 500000.0, factor = 8.0, low = 1.0, high = 4.0, original = 8192.0;
  constexpr index_t half = rotary_dim / 2;
  for (index_t p = 0; p < max_position; ++p)
    for (index_t c = 0; c < half; ++c) {
      double inv_freq = std::pow(base, -2.0 * static_cast<double>(c) / rotary_dim);
      const double wavelength = 2 * std::numbers::pi / inv_freq;
      if (wavelength > original / low) {
        inv_freq /= factor;
      } else if (wavelength > original / high) {
        const double smooth = (original / wavelength - low) / (high - low);
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq;
      }
      cos.push_back(static_cast<float>(std::cos(static_cast<double>(p) * inv_freq)));
      sin.push_back(static_cast<float>(std::sin(static_cast<double>(p) * inv_freq)));
    }
}

struct Rng {  // splitmix64: the same values on every platform
  std::uint64_t state;
  float uniform() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<float>((z ^ (z >> 31)) >> 40) * 0x1.0p-24f * 2 - 1;
  }
};

/// max |o - softmax(q k^T / sqrt(d)) v| for one sequence's new query rows (the last token:
/// it sees every key), k and v its rotated K and V [length, heads_kv, head_dim].
double naive_error(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                   const float* o) {
  const index_t length = static_cast<index_t>(k.size()) / (heads_kv * head_dim);
  double worst = 0;
  for (index_t h = 0; h < heads_q; ++h) {
    const index_t kh = h / (heads_q / heads_kv);
    std::vector<double> p(static_cast<std::size_t>(length));
    double m = -INFINITY, sum = 0;
    for (index_t j = 0; j < length; ++j) {
      double dot = 0;
      for (index_t c = 0; c < head_dim; ++c) dot += double(q[h * head_dim + c]) * k[(j * heads_kv + kh) * head_dim + c];
      p[j] = dot / std::sqrt(double(head_dim));
      m = std::max(m, p[j]);
    }
    for (double& e : p) sum += (e = std::exp(e - m));
    for (index_t c = 0; c < head_dim; ++c) {
      double acc = 0;
      for (index_t j = 0; j < length; ++j) acc += p[j] * v[(j * heads_kv + kh) * head_dim + c];
      worst = std::max(worst, std::abs(acc / sum - o[h * head_dim + c]));
    }
  }
  return worst;
}

/// [n, heads, head_dim] rows over a contiguous buffer.
template <class T>
tileattn::StridedView<T, 3> rows(T* data, index_t n, index_t heads) {
  return {data, {n, heads, head_dim}, {heads * head_dim, head_dim, 1}};
}

}  // namespace

int main() {
  std::vector<float> cos, sin;
  llama3_tables(cos, sin);
  tileattn::RotaryOptions rotary;  // FlashAttention's rotary_cos, rotary_sin, rotary_interleaved
  rotary.cos = {cos.data(), {max_position, rotary_dim / 2}, {rotary_dim / 2, 1}};
  rotary.sin = {sin.data(), {max_position, rotary_dim / 2}, {rotary_dim / 2, 1}};
  rotary.interleaved = false;

  const tileattn::KvCacheConfig config{.num_layers = 1, .num_pages = 16, .page_size = 16, .heads_kv = heads_kv,
                                       .head_dim = head_dim};
  tileattn::KvCache<float> fused(config), unfused(config);
  const std::vector<index_t> prompts{37, 5};
  std::vector<tileattn::SequenceId> ids, plain_ids;
  std::vector<std::vector<float>> k_seen(2), v_seen(2);  // each sequence's rotated K and V, for the check
  Rng rng{1};
  const auto random = [&](index_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = rng.uniform();
    return x;
  };
  const auto positions = [](index_t first, index_t n) {
    std::vector<std::int64_t> p(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = first + i;
    return p;
  };

  // Prefill: each prompt's K/V appended at once, K rotated at positions 0, 1, ...
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    const index_t n = prompts[s];
    std::vector<float> k = random(n * heads_kv * head_dim), v = random(n * heads_kv * head_dim);
    ids.push_back(fused.create());
    fused.append(ids.back(), tileattn::make_bshd<const float>(k.data(), 1, n, heads_kv, head_dim),
                 tileattn::make_bshd<const float>(v.data(), 1, n, heads_kv, head_dim), rotary);
    tileattn::apply_rotary(rows(k.data(), n, heads_kv), positions(0, n), rotary);  // the unfused pass
    plain_ids.push_back(unfused.create());
    unfused.append(plain_ids.back(), tileattn::make_bshd<const float>(k.data(), 1, n, heads_kv, head_dim),
                   tileattn::make_bshd<const float>(v.data(), 1, n, heads_kv, head_dim));
    k_seen[s] = k;
    v_seen[s] = v;
  }

  // Decode: per step and sequence, extend by one token and write its K/V; then one
  // forward_paged call for the batch, Q rotated at each sequence's last position.
  double worst = 0;
  bool same_bits = true;
  for (int step = 0; step < 6; ++step) {
    const index_t batch = static_cast<index_t>(ids.size());
    std::vector<float> q = random(batch * heads_q * head_dim), q_rotated = q;
    std::vector<std::int64_t> q_positions;
    for (std::size_t s = 0; s < ids.size(); ++s) {
      std::vector<float> k = random(heads_kv * head_dim), v = random(heads_kv * head_dim);
      fused.extend(ids[s], 1);
      fused.write(0, ids[s], rows<const float>(k.data(), 1, heads_kv), rows<const float>(v.data(), 1, heads_kv), rotary);
      const index_t position = fused.length(ids[s]) - 1;
      tileattn::apply_rotary(rows(k.data(), 1, heads_kv), positions(position, 1), rotary);
      unfused.extend(plain_ids[s], 1);
      unfused.write(0, plain_ids[s], rows<const float>(k.data(), 1, heads_kv), rows<const float>(v.data(), 1, heads_kv));
      k_seen[s].insert(k_seen[s].end(), k.begin(), k.end());
      v_seen[s].insert(v_seen[s].end(), v.begin(), v.end());
      q_positions.push_back(position);
    }
    tileattn::apply_rotary(rows(q_rotated.data(), batch, heads_q), q_positions, rotary);

    std::vector<float> o(q.size()), o_unfused(q.size());
    tileattn::PagedOptions options;
    options.rotary = rotary;  // Q rotated as it is loaded
    const auto tables = fused.batch(ids);
    tileattn::forward_paged(tileattn::make_bshd<const float>(q.data(), batch, 1, heads_q, head_dim), fused.k_pages(0),
                            fused.v_pages(0), tables.block_table_view(), tables.seqlens(),
                            tileattn::make_bshd(o.data(), batch, 1, heads_q, head_dim), options);
    const auto plain_tables = unfused.batch(plain_ids);
    tileattn::forward_paged(tileattn::make_bshd<const float>(q_rotated.data(), batch, 1, heads_q, head_dim),
                            unfused.k_pages(0), unfused.v_pages(0), plain_tables.block_table_view(),
                            plain_tables.seqlens(), tileattn::make_bshd(o_unfused.data(), batch, 1, heads_q, head_dim));
    same_bits = same_bits && std::memcmp(o.data(), o_unfused.data(), o.size() * sizeof(float)) == 0;
    for (std::size_t s = 0; s < ids.size(); ++s) {
      const std::vector<float> qs(q_rotated.begin() + static_cast<std::ptrdiff_t>(s * heads_q * head_dim),
                                  q_rotated.begin() + static_cast<std::ptrdiff_t>((s + 1) * heads_q * head_dim));
      worst = std::max(worst, naive_error(qs, k_seen[s], v_seen[s], o.data() + s * heads_q * head_dim));
    }
    std::printf("step %d: lengths %lld, %lld; max |O - naive| so far %.2e\n", step,
                static_cast<long long>(fused.length(ids[0])), static_cast<long long>(fused.length(ids[1])), worst);
  }
  std::printf("fused and unfused outputs %s\n", same_bits ? "bitwise equal" : "DIFFER");
  return same_bits && worst < 1e-4 ? 0 : 1;
}
