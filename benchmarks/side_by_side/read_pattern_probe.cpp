// benchmarks/side_by_side/read_pattern_probe.cpp: how fast T threads read a 1 GiB pool in
// blocks of BLOCK bytes taken in random order (a paged KV cache's contiguous runs: one K/V
// head's 16-token bf16 page at d 128 is 4 KiB), against the same pool read in order; with the
// pool on 4 KiB pages or on transparent huge pages, with or without a software prefetch of
// the block DIST ahead (one prefetcht0 per line read). No arithmetic: what the memory system
// gives a decode step's access pattern before any product runs (docs/paged.md, issue 44).
// Caches are flushed (256 MiB read) before each of 5 runs; median, min and max GB/s.
//   g++ -O2 -march=native -fopenmp benchmarks/side_by_side/read_pattern_probe.cpp -o /tmp/read_probe
//   /tmp/read_probe THREADS PREFETCH(0|1) BLOCK [DIST]       (HUGE=1: huge pages; SEQ=1: blocks in order)
//   taskset -c 0-1 /tmp/read_probe 2 0 4096; HUGE=1 taskset -c 0-1 /tmp/read_probe 2 1 4096 2
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: read_pattern_probe THREADS PREFETCH(0|1) BLOCK [DIST]\n");
    return 2;
  }
  const int threads = atoi(argv[1]), variant = atoi(argv[2]);
  const size_t block = atol(argv[3]);
  const int dist = argc > 4 ? atoi(argv[4]) : 1;
  const size_t bytes = size_t(1) << 30, nblocks = bytes / block;
  char* pool = (char*)aligned_alloc(1 << 21, bytes);
  if (getenv("HUGE") && std::string(getenv("HUGE")) == "1") madvise(pool, bytes, MADV_HUGEPAGE);
  memset(pool, 1, bytes);
  std::vector<size_t> order(nblocks);
  for (size_t i = 0; i < nblocks; ++i) order[i] = i;
  if (!getenv("SEQ")) std::shuffle(order.begin(), order.end(), std::mt19937(1));
  std::vector<float> flush((size_t)256 << 20);
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    float fs = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : fs)
    for (size_t i = 0; i < flush.size(); i += 16) fs += flush[i];
    auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const size_t per = nblocks / threads, b0 = omp_get_thread_num() * per, b1 = b0 + per;
      __m512 acc = _mm512_setzero_ps();
      const size_t lines = block / 64;
      for (size_t b = b0; b < b1; ++b) {
        const char* x = pool + order[b] * block;
        const char* nx = b + dist < b1 ? pool + order[b + dist] * block : x;
        for (size_t l = 0; l < lines; ++l) {
          if (variant == 1) _mm_prefetch(nx + 64 * l, _MM_HINT_T0);
          acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(x + 64 * l)));
        }
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, acc);  // (not _mm512_reduce_add_ps: GCC 12 warns inside it)
      for (float x : lanes) total += x;
    }
    rates.push_back(bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
    if (total == 42 || fs == 42) printf("x");
  }
  std::sort(rates.begin(), rates.end());
  printf("threads %d block %6zu %s %s prefetch %d (dist %d): GB/s median %5.1f (min %5.1f max %5.1f)\n", threads, block,
         getenv("HUGE") && std::string(getenv("HUGE")) == "1" ? "huge" : "4k  ", getenv("SEQ") ? "seq " : "shuf", variant, dist, rates[2], rates[0], rates[4]);
}
