// tests/bits_probe/bits_probe.cpp: writes the bytes of every output of a fixed set of calls
// (forward, backward, paged decode and verify, 8- and 4-bit caches, Hadamard, MLA, top-k,
// prefix-once, flex, rotary; fp32 and bf16; 1 and 2 threads) to one file per call in the
// directory given, so that two revisions of the library can be compared bit for bit with
// cmp (scripts/bits_probe.sh builds it at both and runs it under every micro-kernel set).
// A refactoring that claims no behaviour change must leave every file identical.
//
//   bits_probe OUT_DIR      (the micro-kernel set: TILEATTN_ISA, TILEATTN_NO_AMX)
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace {

using tileattn::bf16;
using tileattn::index_t;

std::string out_dir;

template <class T>
void dump(const std::string& name, const std::vector<T>& x) {
  FILE* f = std::fopen((out_dir + "/" + name + ".bin").c_str(), "wb");
  if (!f) { std::perror(name.c_str()); std::exit(2); }
  std::fwrite(x.data(), sizeof(T), x.size(), f);
  std::fclose(f);
}

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<T> x(n);
  for (T& e : x) e = tileattn::from_float<T>(normal(rng));
  return x;
}

tileattn::Execution threads(int n) {
  tileattn::Execution e;
  e.num_threads = n;
  return e;
}

// ---- contiguous forward and backward ------------------------------------------------------
template <class T>
void contiguous(const std::string& tag, index_t B, index_t N, index_t H, index_t Hkv, index_t D,
                tileattn::ForwardOptions opt, int nt, bool with_backward) {
  const auto q = random_values<T>(std::size_t(B * N * H * D), 1), k = random_values<T>(std::size_t(B * N * Hkv * D), 2),
             v = random_values<T>(std::size_t(B * N * Hkv * D), 3), dout = random_values<T>(std::size_t(B * N * H * D), 4);
  std::vector<T> o(q.size());
  std::vector<float> lse(std::size_t(B * H * N));
  opt.execution = threads(nt);
  tileattn::forward(tileattn::make_bshd(q.data(), B, N, H, D), tileattn::make_bshd(k.data(), B, N, Hkv, D),
                    tileattn::make_bshd(v.data(), B, N, Hkv, D), tileattn::make_bshd(o.data(), B, N, H, D),
                    tileattn::make_lse(lse.data(), B, H, N), opt);
  dump(tag + ".o", o);
  dump(tag + ".lse", lse);
  if (!with_backward) return;
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  tileattn::BackwardOptions bopt;
  static_cast<tileattn::ForwardOptions&>(bopt) = opt;
  tileattn::backward(tileattn::make_bshd(q.data(), B, N, H, D), tileattn::make_bshd(k.data(), B, N, Hkv, D),
                     tileattn::make_bshd(v.data(), B, N, Hkv, D), tileattn::make_bshd(o.data(), B, N, H, D),
                     tileattn::make_lse(lse.data(), B, H, N), tileattn::make_bshd(dout.data(), B, N, H, D),
                     tileattn::make_bshd(dq.data(), B, N, H, D), tileattn::make_bshd(dk.data(), B, N, Hkv, D),
                     tileattn::make_bshd(dv.data(), B, N, Hkv, D), bopt);
  dump(tag + ".dq", dq);
  dump(tag + ".dk", dk);
  dump(tag + ".dv", dv);
}

template <class T>
void flex(const std::string& tag, int nt) {
  const index_t B = 1, N = 300, H = 4, Hkv = 2, D = 64;
  const auto q = random_values<T>(std::size_t(B * N * H * D), 11), k = random_values<T>(std::size_t(B * N * Hkv * D), 12),
             v = random_values<T>(std::size_t(B * N * Hkv * D), 13);
  std::vector<T> o(q.size());
  std::vector<float> lse(std::size_t(B * H * N));
  const auto prefix_lm = [](index_t, index_t, index_t q_idx, index_t kv_idx) { return kv_idx < 40 || kv_idx <= q_idx; };
  const auto blocks = tileattn::create_block_mask(prefix_lm, 1, 1, N, N);
  const auto score_mod = [](float s, index_t, index_t h, index_t q_idx, index_t kv_idx) {
    return s - 0.01f * float(h + 1) * float(q_idx > kv_idx ? q_idx - kv_idx : kv_idx - q_idx);
  };
  tileattn::ForwardOptions opt;
  opt.execution = threads(nt);
  tileattn::forward_flex(tileattn::make_bshd(q.data(), B, N, H, D), tileattn::make_bshd(k.data(), B, N, Hkv, D),
                         tileattn::make_bshd(v.data(), B, N, Hkv, D), tileattn::make_bshd(o.data(), B, N, H, D),
                         tileattn::make_lse(lse.data(), B, H, N), score_mod, blocks, opt);
  dump(tag + ".o", o);
  dump(tag + ".lse", lse);
}

// ---- paged: a KvCache of KV, three sequences (1, 300 and 1000 tokens), queries in T ------
struct PagedCase {
  index_t q_len = 1, heads_q = 8, heads_kv = 2, head_dim = 64, page_size = 16;
  bool causal = false, shared_prefix = false, rotary = false;
};

template <class KV, class T>
void paged(const std::string& tag, const PagedCase& c, int nt) {
  const std::vector<index_t> lens{1, 300, 1000};
  const index_t B = index_t(lens.size()), D = c.head_dim, Hkv = c.heads_kv, H = c.heads_q;
  index_t pages = 0;
  for (index_t n : lens) pages += (n + c.page_size - 1) / c.page_size + 1;
  tileattn::KvCacheConfig config{.num_layers = 1, .num_pages = pages, .page_size = c.page_size, .heads_kv = Hkv,
                                 .head_dim = D};
  tileattn::KvCache<KV> cache(config);
  using Row = std::conditional_t<tileattn::quantized_type<KV> || tileattn::block_pool_type<KV>, float, KV>;
  std::vector<float> cos, sin;
  tileattn::RotaryOptions rotary;
  if (c.rotary) {
    for (index_t p = 0; p < 2048; ++p)
      for (index_t i = 0; i < D / 2; ++i) {
        const double a = double(p) * std::pow(10000.0, -2.0 * double(i) / double(D));
        cos.push_back(float(std::cos(a)));
        sin.push_back(float(std::sin(a)));
      }
    rotary.cos = {cos.data(), {2048, D / 2}, {D / 2, 1}};
    rotary.sin = {sin.data(), {2048, D / 2}, {D / 2, 1}};
  }
  std::vector<tileattn::SequenceId> ids;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const index_t n = lens[b];
    const auto k = random_values<Row>(std::size_t(n * Hkv * D), 100 + b), v = random_values<Row>(std::size_t(n * Hkv * D), 200 + b);
    if (c.shared_prefix && b == 2) {  // the third sequence forks the second and adds 700 tokens
      ids.push_back(cache.fork(ids[1]));
      const auto k2 = random_values<Row>(std::size_t(700 * Hkv * D), 300), v2 = random_values<Row>(std::size_t(700 * Hkv * D), 301);
      cache.append(ids.back(), tileattn::make_bshd(k2.data(), 1, 700, Hkv, D), tileattn::make_bshd(v2.data(), 1, 700, Hkv, D), rotary);
      continue;
    }
    ids.push_back(cache.create());
    cache.append(ids.back(), tileattn::make_bshd(k.data(), 1, n, Hkv, D), tileattn::make_bshd(v.data(), 1, n, Hkv, D), rotary);
  }
  const auto tables = cache.batch(ids);
  const auto q = random_values<T>(std::size_t(B * c.q_len * H * D), 7);
  std::vector<T> o(q.size());
  std::vector<float> lse(std::size_t(B * H * c.q_len));
  tileattn::PagedOptions opt;
  opt.execution = threads(nt);
  opt.causal = c.causal;
  opt.shared_prefix = c.shared_prefix;
  if (c.rotary) opt.rotary = rotary;
  if constexpr (tileattn::quantized_type<KV>) {
    opt.k_scale = cache.k_scales(0);
    opt.v_scale = cache.v_scales(0);
  }
  tileattn::forward_paged(tileattn::make_bshd(q.data(), B, c.q_len, H, D), cache.k_pages(0), cache.v_pages(0),
                          tables.block_table_view(), tables.seqlens(), tileattn::make_bshd(o.data(), B, c.q_len, H, D),
                          tileattn::make_lse(lse.data(), B, H, c.q_len), opt);
  dump(tag + ".o", o);
  dump(tag + ".lse", lse);
  if constexpr (std::is_same_v<KV, T>) {
    if (c.q_len != 1 || c.shared_prefix || c.rotary) return;
    // Top-k over the same cache: every row attends a fixed pseudo-random subset.
    const index_t topk = 64;
    std::vector<std::int32_t> idx(std::size_t(B * c.q_len * topk));
    std::mt19937 rng(5);
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < topk; ++j)
        idx[std::size_t(b * topk + j)] = j < lens[std::size_t(b)] ? std::int32_t(rng() % lens[std::size_t(b)]) : -1;
    for (index_t b = 0; b < B; ++b)  // distinct positions per row
      for (index_t j = 0; j < topk; ++j)
        if (idx[std::size_t(b * topk + j)] >= 0) idx[std::size_t(b * topk + j)] = std::int32_t((j * 7 + b) % lens[std::size_t(b)]);
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < topk; ++j)
        if (j >= lens[std::size_t(b)]) idx[std::size_t(b * topk + j)] = -1;
    tileattn::PagedOptions topt;
    topt.execution = threads(nt);
    tileattn::forward_paged_topk(tileattn::make_bshd(q.data(), B, 1, H, D), cache.k_pages(0), cache.v_pages(0),
                                 tables.block_table_view(), tables.seqlens(),
                                 tileattn::make_topk_indices(idx.data(), B, 1, topk),
                                 tileattn::make_bshd(o.data(), B, 1, H, D), tileattn::make_lse(lse.data(), B, H, 1), topt);
    dump(tag + ".topk.o", o);
    dump(tag + ".topk.lse", lse);
  }
}

// ---- MLA: a latent cache of 80 dims (64 + 16), V its first 64 ------------------------------
template <class T>
void mla(const std::string& tag, index_t q_len, int nt) {
  const std::vector<index_t> lens{5, 700};
  const index_t B = 2, H = 16, D = 80, Dv = 64, P = 64;
  tileattn::KvCacheConfig config{.num_layers = 1, .num_pages = 16, .page_size = P, .heads_kv = 1, .head_dim = D,
                                 .head_dim_v = Dv};
  config.latent = true;
  tileattn::KvCache<T> cache(config);
  std::vector<tileattn::SequenceId> ids;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const auto rows = random_values<T>(std::size_t(lens[b] * D), 400 + b);
    ids.push_back(cache.create());
    cache.append_latent(ids.back(), tileattn::make_bshd(rows.data(), 1, lens[b], 1, D));
  }
  const auto tables = cache.batch(ids);
  const auto q = random_values<T>(std::size_t(B * q_len * H * D), 8);
  std::vector<T> o(std::size_t(B * q_len * H * Dv));
  std::vector<float> lse(std::size_t(B * H * q_len));
  tileattn::PagedOptions opt;
  opt.execution = threads(nt);
  opt.causal = true;
  tileattn::forward_paged_mla(tileattn::make_bshd(q.data(), B, q_len, H, D), cache.k_pages(0), tables.block_table_view(),
                              tables.seqlens(), tileattn::make_bshd(o.data(), B, q_len, H, Dv),
                              tileattn::make_lse(lse.data(), B, H, q_len), opt);
  dump(tag + ".o", o);
  dump(tag + ".lse", lse);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: bits_probe OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  for (int nt : {1, 2}) {
    const std::string t = ".t" + std::to_string(nt);
    tileattn::ForwardOptions causal;
    causal.causal = true;
    tileattn::ForwardOptions windowed;
    windowed.window_left = 50;
    windowed.softcap = 30.0f;
    static const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    windowed.sinks = sinks;
    contiguous<float>("fwd_f32_causal" + t, 2, 127, 4, 2, 72, causal, nt, true);
    contiguous<float>("fwd_f32_window" + t, 1, 300, 4, 2, 64, windowed, nt, true);
    contiguous<bf16>("fwd_bf16_causal" + t, 1, 517, 4, 1, 128, causal, nt, true);
    contiguous<bf16>("fwd_bf16_window" + t, 2, 130, 4, 2, 64, windowed, nt, true);
    contiguous<tileattn::fp16>("fwd_fp16_causal" + t, 1, 200, 2, 2, 64, causal, nt, false);
    contiguous<float>("fwd_f32_d1" + t, 1, 17, 1, 1, 1, causal, nt, true);
    flex<float>("flex_f32" + t, nt);
    flex<bf16>("flex_bf16" + t, nt);
    PagedCase decode, verify, prefix, rotary, wide;
    verify.q_len = 4;
    verify.causal = true;
    prefix.shared_prefix = true;
    rotary.rotary = true;
    wide.heads_q = 32;
    wide.heads_kv = 8;
    wide.head_dim = 128;
    paged<float, float>("paged_f32_decode" + t, decode, nt);
    paged<float, float>("paged_f32_verify" + t, verify, nt);
    paged<bf16, bf16>("paged_bf16_decode" + t, decode, nt);
    paged<bf16, bf16>("paged_bf16_verify" + t, verify, nt);
    paged<bf16, bf16>("paged_bf16_wide" + t, wide, nt);
    paged<float, float>("paged_f32_prefix" + t, prefix, nt);
    paged<bf16, bf16>("paged_bf16_prefix" + t, prefix, nt);
    paged<float, float>("paged_f32_rotary" + t, rotary, nt);
    paged<std::int8_t, float>("paged_int8_decode" + t, decode, nt);
    paged<std::int8_t, float>("paged_int8_verify" + t, verify, nt);
    paged<tileattn::fp8_e4m3, float>("paged_e4m3_decode" + t, decode, nt);
    paged<std::int8_t, bf16>("paged_int8_bf16q" + t, decode, nt);
    paged<tileattn::q4_0_block, float>("paged_q4_0_decode" + t, decode, nt);
    paged<tileattn::q4_0_block, float>("paged_q4_0_verify" + t, verify, nt);
    paged<tileattn::mxfp4_block, bf16>("paged_mxfp4_decode" + t, decode, nt);
    paged<tileattn::hadamard_rotated<tileattn::q4_0_block>, float>("paged_q4_0_hadamard" + t, decode, nt);
    mla<bf16>("mla_bf16_decode" + t, 1, nt);
    mla<float>("mla_f32_verify" + t, 3, nt);
  }
  std::printf("bits_probe: wrote %s (micro-kernels: %s)\n", out_dir.c_str(), tileattn::active_isa());
  return 0;
}
