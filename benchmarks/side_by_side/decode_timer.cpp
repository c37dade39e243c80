// benchmarks/side_by_side/decode_timer.cpp: one tileattn paged decode step (forward_paged,
// seqlen_q 1) on B sequences of CTX cached keys in shuffled 16-token pages: median, min and
// max K/V GB/s (bytes in the stored type; 8-bit scales not counted) of R timed runs after one
// warm-up, the fraction of a streaming read on the same threads (benchmarks/ceilings.hpp) the
// median reaches, and a hash of O (equal hashes across thread counts: bitwise-equal outputs).
//   decode_timer B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16|fp8|int8]
// Environment:
//   FLUSH_MB (default 1024): before every run, warm-up included, the threads read a buffer of
//            this many MiB, so K/V come from memory, not from a last-level cache (the Xeon's
//            300 MiB L3 holds a B 8, 4k bf16 cache whole); 0 turns it off.
//   LAYOUT   token (default): pools [pages, page_size, heads_kv, d] in memory, FlashAttention's
//            and vLLM's flash layout: one head's rows of a page are heads_kv * d apart.
//            head: [pages, heads_kv, page_size, d] in memory (vLLM's paged-attention layout),
//            the same view shape with other strides: one head's page is one contiguous run.
//            pool: [heads_kv, pages, page_size, d] in memory, one pool per K/V head: a head's
//            page is one contiguous run, and so are consecutive pages.
//   PAGE     tokens per page (default 16).
//   ORDER    shuffled (default: the block tables list the pages in random order) or
//            ascending (each sequence's pages consecutive in the pool).
//   HUGE     1: the pools advised onto transparent huge pages (madvise) before first touch.
//   TILE_ROWS  where AMX tiles are in use, the fewest query rows per K/V group whose in-place
//            products run on them (arch::amx::tile_decode_min_rows, default 8; 1: all; 17: none).
//   QLEN     new tokens per sequence (default 1): more is a speculative verify step, causal
//            bottom-right over the cache; its GB/s count the same K/V bytes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "../ceilings.hpp"
#include "tileattn/tileattn.hpp"

using tileattn::index_t;

namespace {

/// Reads `mib` MiB on `threads` threads (evicting K/V from every cache level); returns a sum
/// so the reads are not optimized away.
float flush_caches(std::size_t mib, int threads) {
  static std::vector<float> buffer;
  if (mib == 0) return 0.0f;
  if (buffer.size() != mib * 1024 * 1024 / sizeof(float)) buffer.assign(mib * 1024 * 1024 / sizeof(float), 1.0f);
  std::vector<float> partial(static_cast<std::size_t>(threads));
  tileattn::bench::run_on_threads(threads, [&](int t) {
    const std::size_t n = buffer.size(), begin = n * t / threads, end = n * (t + 1) / threads;
    float s = 0;
    for (std::size_t i = begin; i < end; i += 16) s += buffer[i];
    partial[static_cast<std::size_t>(t)] = s;
  });
  return std::accumulate(partial.begin(), partial.end(), 0.0f);
}

/// K or V pool memory: 2 MiB aligned, and with HUGE=1 advised onto transparent huge pages
/// (madvise; the kernel's THP setting must allow it) before it is first touched.
template <class T>
struct Pool {
  T* ptr;
  std::size_t n;
  Pool(std::size_t count, bool huge) : n(count) {
    constexpr std::size_t align = std::size_t{2} << 20;
    const std::size_t bytes = (count * sizeof(T) + align - 1) / align * align;
    ptr = static_cast<T*>(std::aligned_alloc(align, bytes));
    if (huge) madvise(ptr, bytes, MADV_HUGEPAGE);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { std::free(ptr); }
  T* begin() { return ptr; }
  T* end() { return ptr + n; }
  T* data() { return ptr; }
};

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, tileattn::bf16>) return "bf16";
  else if constexpr (std::is_same_v<T, tileattn::fp8_e4m3>) return "fp8";
  else return "int8";
}

template <class T>
T random_value(std::mt19937& rng, std::normal_distribution<float>& normal) {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<T>(std::clamp(normal(rng) * 40.0f, -127.0f, 127.0f));
  else if constexpr (std::is_same_v<T, tileattn::fp8_e4m3>) return T(normal(rng) * 40.0f);
  else return tileattn::from_float<T>(normal(rng));
}

template <class T>
int run(index_t b, index_t ctx, index_t hq, index_t hkv, index_t d, int threads, int repeats) {
  constexpr bool eight_bit = sizeof(T) == 1;
  using Q = std::conditional_t<eight_bit, float, T>;  // 8-bit caches: float queries
  const char* page_env = std::getenv("PAGE");
  const index_t page = page_env != nullptr ? std::max<index_t>(1, std::atol(page_env)) : 16;
  const char* layout_env = std::getenv("LAYOUT");
  const std::string layout = layout_env != nullptr ? layout_env : "token";
  const bool head_major = layout == "head", head_pools = layout == "pool";
  const char* order_env = std::getenv("ORDER");
  const bool ascending = order_env != nullptr && std::string(order_env) == "ascending";
  const char* flush_env = std::getenv("FLUSH_MB");
  const std::size_t flush_mib = flush_env != nullptr ? static_cast<std::size_t>(std::atol(flush_env)) : 1024;
  const index_t max_pages = (ctx + page - 1) / page, pages = b * max_pages;
  const auto elements = static_cast<std::size_t>(pages * page * hkv * d);
  const char* huge_env = std::getenv("HUGE");
  const bool huge = huge_env != nullptr && std::string(huge_env) == "1";
  Pool<T> k(elements, huge), v(elements, huge);
  const char* qlen_env = std::getenv("QLEN");
  const index_t sq = qlen_env != nullptr ? std::max<index_t>(1, std::atol(qlen_env)) : 1;
  std::vector<Q> q(static_cast<std::size_t>(b * sq * hq * d)), o(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (auto* x : {&k, &v})
    for (auto& e : *x) e = random_value<T>(rng, normal);  // (first touch: after the madvise)
  for (auto& e : q) e = tileattn::from_float<Q>(normal(rng));
  std::vector<float> k_scales(static_cast<std::size_t>(pages * hkv)), v_scales(k_scales.size());
  for (auto* s : {&k_scales, &v_scales})
    for (float& x : *s) x = 0.02f + 0.01f * static_cast<float>(rng() % 100) / 100.0f;
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages)), lens(static_cast<std::size_t>(b), static_cast<std::int32_t>(ctx));
  std::iota(table.begin(), table.end(), 0);
  if (!ascending) std::shuffle(table.begin(), table.end(), rng);
  tileattn::PagedOptions opt;
  opt.execution = {tileattn::Backend::openmp, threads};
  opt.causal = sq > 1;
#if defined(TILEATTN_HAS_AMX_KERNELS)
  if (const char* tiles = std::getenv("TILE_ROWS")) tileattn::arch::amx::tile_decode_min_rows = std::atol(tiles);
#endif  // a verify step: the new tokens see the cache and each other, bottom-right aligned
  if constexpr (std::is_same_v<T, std::int8_t>) {
    opt.k_scale = {k_scales.data(), {pages, hkv}, {hkv, 1}};
    opt.v_scale = {v_scales.data(), {pages, hkv}, {hkv, 1}};
  } else if constexpr (eight_bit) {
    opt.k_scale = tileattn::per_tensor_scale(&k_scales[0]);
    opt.v_scale = tileattn::per_tensor_scale(&v_scales[0]);
  }
  // The pool view is [pages, page_size, heads_kv, d] either way; head-major memory only
  // changes its strides.
  const std::array<index_t, 4> shape{pages, page, hkv, d};
  const std::array<index_t, 4> strides = head_major   ? std::array<index_t, 4>{page * hkv * d, d, page * d, 1}
                                         : head_pools ? std::array<index_t, 4>{page * d, d, pages * page * d, 1}
                                                      : std::array<index_t, 4>{page * hkv * d, hkv * d, d, 1};
  const tileattn::TensorView<const T> kv_k{k.data(), shape, strides}, kv_v{v.data(), shape, strides};
  const auto step = [&] {
    tileattn::forward_paged(tileattn::make_bshd<const Q>(q.data(), b, sq, hq, d), kv_k, kv_v,
                            tileattn::make_block_table(table.data(), b, max_pages), lens,
                            tileattn::make_bshd(o.data(), b, sq, hq, d), opt);
  };
  std::vector<double> seconds;
  float sink = 0;
  for (int r = 0; r <= repeats; ++r) {
    sink += flush_caches(flush_mib, threads);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double gb = 2.0 * static_cast<double>(b * ctx * hkv * d) * sizeof(T) * 1e-9;
  std::uint64_t hash = 1469598103934665603ull;
  for (const Q& x : o) {
    std::uint16_t bits[sizeof(Q) / 2];
    std::memcpy(bits, &x, sizeof(Q));
    for (auto w : bits) hash = (hash ^ w) * 1099511628211ull;
  }
  const double median = gb / seconds[seconds.size() / 2];
  std::printf("tileattn decode %s %s page %ld%s B %ld ctx %ld H %ld/%ld d %ld threads %2d: KV GB/s median %7.2f min %7.2f max %7.2f "
              "of_stream %.2f ms %.3f flush %zu hash %016llx%s\n",
              type_name<T>(), layout.c_str(), static_cast<long>(page), ascending ? " ascending" : "", static_cast<long>(b), static_cast<long>(ctx),
              static_cast<long>(hq), static_cast<long>(hkv), static_cast<long>(d), threads, median, gb / seconds.back(),
              gb / seconds.front(), median / tileattn::bench::stream_read_gbps(threads),
              1e3 * seconds[seconds.size() / 2], flush_mib, static_cast<unsigned long long>(hash),
              sink == 12345.0f ? " " : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: decode_timer B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16|fp8|int8]\n");
    return 2;
  }
  const auto arg = [&](int i) { return static_cast<index_t>(std::atol(argv[i])); };
  const std::string dtype = argc > 8 ? argv[8] : "fp32";
  const index_t b = arg(1), ctx = arg(2), hq = arg(3), hkv = arg(4), d = arg(5);
  const int threads = static_cast<int>(arg(6)), repeats = static_cast<int>(arg(7));
  if (dtype == "bf16") return run<tileattn::bf16>(b, ctx, hq, hkv, d, threads, repeats);
  if (dtype == "fp8") return run<tileattn::fp8_e4m3>(b, ctx, hq, hkv, d, threads, repeats);
  if (dtype == "int8") return run<std::int8_t>(b, ctx, hq, hkv, d, threads, repeats);
  return run<float>(b, ctx, hq, hkv, d, threads, repeats);
}
