// benchmarks/side_by_side/decode_breakdown.cpp: what one key costs a decode step's in-place
// micro-kernels (kernels/key_loaders.hpp's InPlaceLoader), with the key tile's rows in
// L1/L2: Q K^T over the rows (gemm_nt_rows), the row maxima and the exponentials of the
// online softmax, P V over the rows (gemm_rows) and the streaming pass (touch_rows), for a
// GQA group of 4 query rows, a 128-key tile and head_dim 128, per storage type, with the rows
// of one head adjacent (stride 128: a head-major page) and 1024 elements apart (a
// token-major page of 8 K/V heads). ns per key, median of 5; compare with decode_timer's
// time per key and head to see what memory adds. Where the set multiplies bf16 pairs in place
// it also times those products (Q and P as bf16 pairs): on vdpbf16ps (arch/avx512/pairs_in_place.hpp),
// which a bf16 decode step runs on Zen 5 instead, or on AMX tiles (arch/amx.hpp), which decode
// and verify steps run from 8 query rows per K/V group (arch::amx::tile_decode_min_rows).
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/decode_breakdown.cpp -o /tmp/db
//   taskset -c 2 /tmp/db
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tileattn/tileattn.hpp"

using namespace tileattn;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
double ns_per_key(index_t keys, F&& f) {
  constexpr int reps = 4000;
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    f();
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) f();
    runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps / static_cast<double>(keys) * 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}


template <class E>
void run(const char* name, index_t row_stride) {
  constexpr index_t g = 4, bc = 128, d = 128;
  std::vector<E> k_buf(static_cast<std::size_t>(bc * row_stride)), v_buf(k_buf.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const float spread = sizeof(E) == 1 ? 20.0f : 1.0f;  // 8-bit: integers / fp8 values of a few tens
  for (auto* buf : {&k_buf, &v_buf})
    for (auto& x : *buf) x = E(std::clamp(normal(rng) * spread, -100.0f, 100.0f));
  std::vector<const E*> k_rows(bc), v_rows(bc);
  for (index_t j = 0; j < bc; ++j) {
    k_rows[static_cast<std::size_t>(j)] = k_buf.data() + j * row_stride;
    v_rows[static_cast<std::size_t>(j)] = v_buf.data() + j * row_stride;
  }
  std::vector<float> q(g * d), s(g * bc), o(g * d, 0.0f);
  for (auto& x : q) x = normal(rng);
  float scale[g], shift[g], sums[g];
  std::fill_n(scale, g, 0.1f);
  std::fill_n(shift, g, 3.0f);
  float sink = 0;
  const double qk = ns_per_key(bc, [&] { arch::native::gemm_nt_rows(g, bc, d, q.data(), d, k_rows.data(), s.data(), bc); });
  const double max = ns_per_key(bc, [&] {
    for (index_t i = 0; i < g; ++i) sink += arch::native::row_max(s.data() + i * bc, bc);
  });
  const double exp = ns_per_key(bc, [&] {
    std::fill(s.begin(), s.end(), 1.0f);
    arch::native::exp2_shift_sum_rows(s.data(), bc, g, bc, scale, shift, sums);
  });
  const double pv = ns_per_key(bc, [&] { arch::native::gemm_rows(g, d, bc, s.data(), bc, v_rows.data(), o.data(), d); });
  const double touch = ns_per_key(bc, [&] {
    arch::native::touch_rows(reinterpret_cast<const void* const*>(k_rows.data()), bc, d * static_cast<index_t>(sizeof(E)));
    arch::native::touch_rows(reinterpret_cast<const void* const*>(v_rows.data()), bc, d * static_cast<index_t>(sizeof(E)));
  });
  std::printf("%-5s rows %4ld apart  ns/key: QK %6.2f  row max %5.2f  exp (with a refill) %5.2f  PV %6.2f  "
              "touch %5.2f  sum %6.2f%s\n",
              name, static_cast<long>(row_stride), qk, max, exp, pv, touch, qk + max + exp + pv + touch,
              sink == 12345.0f ? " " : "");
  if constexpr (std::is_same_v<E, bf16>) {
#if defined(TILEATTN_HAS_AMX_KERNELS)
    arch::amx::tile_decode_min_rows = 1;  // (on a Xeon with AMX: the tile products, which decode uses from 8 rows)
#endif
    if (arch::set_detail::value(arch::native::in_place_pairs)) {  // the pair products (decode's, on Zen 5)
      std::vector<bf16x2> q_pairs(g * d / 2), p_pairs(g * bc / 2);
      for (auto& x : q_pairs) x = {bf16(normal(rng)), bf16(normal(rng))};
      for (auto& x : p_pairs) x = {bf16(0.5f * normal(rng)), bf16(0.5f * normal(rng))};
      const double qk_p = ns_per_key(bc, [&] {
        arch::native::gemm_nt_rows_pairs(g, bc, d, q_pairs.data(), d / 2, k_rows.data(), s.data(), bc);
      });
      const double pv_p = ns_per_key(bc, [&] {
        arch::native::gemm_rows_pairs(g, d, bc, p_pairs.data(), bc / 2, v_rows.data(), o.data(), d);
      });
      std::printf("      on bf16 pairs (%s): QK %6.2f  PV %6.2f ns/key\n",
                  std::string(arch::native_name()).find("amx") != std::string::npos ? "AMX tiles" : "vdpbf16ps", qk_p, pv_p);
    }
  }
}

}  // namespace

int main() {
  std::printf("micro-kernel set: %s; 4 query rows, 128 keys, head_dim 128\n", arch::native_name());
  for (index_t stride : {index_t{128}, index_t{1024}}) {
    run<float>("fp32", stride);
    run<bf16>("bf16", stride);
    run<std::int8_t>("int8", stride);
    run<fp8_e4m3>("fp8", stride);
  }
}
