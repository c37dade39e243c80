// examples/paged_decode_minimal.cpp: a self-contained paged, split-KV decode step for one
// sequence, in plain C++20 (standard library only), written to be read next to the
// PagedAttention (vLLM) paper and the flash-decoding write-up.
//
//   g++ -std=c++20 -O2 paged_decode_minimal.cpp -o paged_decode && ./paged_decode
//
// Paging (PagedAttention): the KV cache is not one array per sequence but a pool of fixed-size
// pages, K and V each [num_pages, page_size, heads_kv, d], row-major float, as in vLLM and
// FlashAttention's flash_attn_with_kvcache. A sequence owns the pages listed, in order, in its
// block table (int32 page ids, in any order in the pool); key j lives at page
// block_table[j / page_size], row j % page_size, and cache_seqlen says how many keys there are.
// Decoding: one new token, so Q is [heads_q, d] and O is [heads_q, d], LSE is [heads_q].
// GQA: heads_q = G * heads_kv and query head h reads K/V head h / G, so the G query heads of a
// group are kept resident as a small (G, d) tile and attend together to each K/V page: every
// page is read once per K/V head, not once per query head. Each page is a key/value tile
// (Bc = page_size in FlashAttention's terms) with the usual online softmax (running m and l).
// Split-KV (flash-decoding): one query row gives too little parallel work, so the pages are cut
// into num_splits chunks, each chunk yields a partial (O_c, LSE_c) on its own (on a GPU, in
// parallel), and a last pass merges the partials exactly by their log-sum-exp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace paged_minimal {

using index_t = std::ptrdiff_t;

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// One sequence's view of a paged KV cache (non-owning).
struct PagedKV {
  const float* k_pages;             // [num_pages, page_size, heads_kv, d]
  const float* v_pages;             // [num_pages, page_size, heads_kv, d]
  const std::int32_t* block_table;  // [ceil(cache_seqlen / page_size)] page ids, in key order
  index_t cache_seqlen;             // number of cached keys
  index_t page_size, heads_kv, d;   // d = head_dim
};

/// The (d) row of K/V head `head_kv` at `row` of page `page` in a pool.
inline const float* page_row(const float* pool, const PagedKV& kv, index_t page, index_t row,
                             index_t head_kv) {
  return pool + ((page * kv.page_size + row) * kv.heads_kv + head_kv) * kv.d;
}

/// Pages [first, end) of the sequence's block table that split `split` of `num_splits` covers:
/// equal runs of whole pages (so chunk boundaries fall on multiples of page_size); the last
/// splits are empty when there are fewer pages than splits.
struct PageRange {
  index_t first, end;
};
inline PageRange split_pages(index_t num_used_pages, index_t num_splits, index_t split) {
  const index_t pages_per_split = (num_used_pages + num_splits - 1) / num_splits;
  const index_t first = std::min(split * pages_per_split, num_used_pages);
  return {first, std::min(first + pages_per_split, num_used_pages)};
}

/// One split's partial result for every query head: O_c = softmax(S_c) V_c over the keys of
/// pages [pages.first, pages.end) only, and LSE_c = log(sum exp(S_c)); an empty split gives
/// O_c = 0 and LSE_c = -inf. O_c is [heads_q, d], LSE_c is [heads_q].
inline void attend_split(const float* Q, const PagedKV& kv, index_t group, float scale,
                         PageRange pages, float* O_c, float* LSE_c) {
  const index_t d = kv.d, page_size = kv.page_size;
  // The on-chip working set of one group (SRAM on a GPU, L1 cache here).
  std::vector<float> sram(static_cast<std::size_t>(2 * group * d + group * page_size + 2 * group));
  float* Q_tile = sram.data();          // (G, d)         the group's queries, times scale
  float* O_tile = Q_tile + group * d;   // (G, d)         output accumulator
  float* S = O_tile + group * d;        // (G, page_size) scores, then probabilities P
  float* m = S + group * page_size;     // (G)            running row max
  float* l = m + group;                 // (G)            running row sum

  for (index_t head_kv = 0; head_kv < kv.heads_kv; ++head_kv) {
    const index_t head_q0 = head_kv * group;  // query heads head_q0 .. head_q0 + G - 1 share it
    for (index_t x = 0; x < group * d; ++x) Q_tile[x] = Q[head_q0 * d + x] * scale;  // (G, d)
    std::fill(O_tile, O_tile + group * d, 0.0f);                 // (G, d)
    std::fill(m, m + group, neg_inf);                            // (G)
    std::fill(l, l + group, 0.0f);                               // (G)

    for (index_t p = pages.first; p < pages.end; ++p) {          // K_j, V_j = one page
      const index_t page = kv.block_table[p];
      const index_t rows = std::min(page_size, kv.cache_seqlen - p * page_size);  // last: partial
      for (index_t r = 0; r < rows; ++r) {                       // S = Q_tile K_j^T (G, rows)
        const float* k_row = page_row(kv.k_pages, kv, page, r, head_kv);  // (d) read once...
        for (index_t g = 0; g < group; ++g) {                    // ...used by all G query rows
          float dot = 0.0f;
          for (index_t e = 0; e < d; ++e) dot += Q_tile[g * d + e] * k_row[e];
          S[g * page_size + r] = dot;
        }
      }
      for (index_t g = 0; g < group; ++g) {                      // online softmax, row by row
        float* S_row = S + g * page_size;                        // (rows)
        const float m_new = std::max(m[g], *std::max_element(S_row, S_row + rows));  // ()
        const float alpha = std::exp(m[g] - m_new);              // () = exp(m_old - m_new)
        float row_sum = 0.0f;
        for (index_t r = 0; r < rows; ++r) row_sum += S_row[r] = std::exp(S_row[r] - m_new);
        l[g] = alpha * l[g] + row_sum;                           // ()
        m[g] = m_new;                                            // ()
        for (index_t e = 0; e < d; ++e) O_tile[g * d + e] *= alpha;  // (d)
      }
      for (index_t r = 0; r < rows; ++r) {                       // O_tile += P V_j (G, d)
        const float* v_row = page_row(kv.v_pages, kv, page, r, head_kv);  // (d) read once
        for (index_t g = 0; g < group; ++g)
          for (index_t e = 0; e < d; ++e) O_tile[g * d + e] += S[g * page_size + r] * v_row[e];
      }
    }

    for (index_t g = 0; g < group; ++g) {                        // O_c = O_tile / l, LSE_c
      const bool saw_a_key = l[g] > 0.0f;                        // false only for an empty split
      for (index_t e = 0; e < d; ++e)
        O_c[(head_q0 + g) * d + e] = saw_a_key ? O_tile[g * d + e] / l[g] : 0.0f;
      LSE_c[head_q0 + g] = saw_a_key ? m[g] + std::log(l[g]) : neg_inf;
    }
  }
}

/// Merges the splits' partials exactly: LSE = log(sum_c exp(LSE_c)), O = sum_c exp(LSE_c - LSE)
/// O_c, with the largest LSE_c taken out first so no exp overflows, and summed in split order
/// c = 0, 1, ... so the result is the same however the splits were scheduled. An empty split
/// (LSE_c = -inf) weighs exp(-inf) = 0; when every split is empty, O = 0 and LSE = -inf.
/// O_partial is [num_splits, heads_q, d], LSE_partial is [num_splits, heads_q].
inline void merge_splits(const float* O_partial, const float* LSE_partial, index_t num_splits,
                         index_t heads_q, index_t d, float* O, float* LSE) {
  for (index_t h = 0; h < heads_q; ++h) {
    float lse_max = neg_inf;
    for (index_t c = 0; c < num_splits; ++c)
      lse_max = std::max(lse_max, LSE_partial[c * heads_q + h]);  // () the largest LSE_c
    std::fill(O + h * d, O + (h + 1) * d, 0.0f);                 // (d)
    if (lse_max == neg_inf) {                                    // no split saw a key
      LSE[h] = neg_inf;
      continue;
    }
    float sum = 0.0f;
    for (index_t c = 0; c < num_splits; ++c)
      sum += std::exp(LSE_partial[c * heads_q + h] - lse_max);   // ()
    LSE[h] = lse_max + std::log(sum);                            // () log(sum_c exp(LSE_c))
    for (index_t c = 0; c < num_splits; ++c) {                   // O += exp(LSE_c - LSE) O_c (d)
      const float weight = std::exp(LSE_partial[c * heads_q + h] - LSE[h]);
      for (index_t e = 0; e < d; ++e) O[h * d + e] += weight * O_partial[(c * heads_q + h) * d + e];
    }
  }
}

/// One decode step: O = softmax(scale * Q K^T) V and LSE for the heads_q query rows of Q
/// against the sequence's cache_seqlen cached keys (no mask: a new token sees them all).
/// heads_q must be a multiple of kv.heads_kv, and num_splits >= 1.
inline void paged_decode(const float* Q, const PagedKV& kv, index_t heads_q, float scale,
                         index_t num_splits, float* O, float* LSE) {
  const index_t group = heads_q / kv.heads_kv;                   // G query heads per K/V head
  const index_t num_used_pages = (kv.cache_seqlen + kv.page_size - 1) / kv.page_size;
  std::vector<float> O_partial(static_cast<std::size_t>(num_splits * heads_q * kv.d));
  std::vector<float> LSE_partial(static_cast<std::size_t>(num_splits * heads_q));
  for (index_t c = 0; c < num_splits; ++c)                       // independent: parallel on a GPU
    attend_split(Q, kv, group, scale, split_pages(num_used_pages, num_splits, c),
                 O_partial.data() + c * heads_q * kv.d, LSE_partial.data() + c * heads_q);
  merge_splits(O_partial.data(), LSE_partial.data(), num_splits, heads_q, kv.d, O, LSE);
}

}  // namespace paged_minimal

#ifndef PAGED_DECODE_MINIMAL_NO_MAIN
namespace {

using paged_minimal::index_t;

// |a - b| where two equal infinities (no key: LSE = -inf) count as exact and NaN as infinite.
double abs_error(double a, double b) {
  if (a == b) return 0.0;
  const double err = std::abs(a - b);
  return std::isnan(err) ? INFINITY : err;
}

// The naive decode in double over contiguous K, V [seqlen, heads_kv, d]: full score row,
// softmax, weighted sum. O is [heads_q, d], LSE is [heads_q].
void naive_decode(const std::vector<float>& Q, const std::vector<float>& K,
                  const std::vector<float>& V, index_t seqlen, index_t heads_q, index_t heads_kv,
                  index_t d, std::vector<double>& O, std::vector<double>& LSE) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> P(static_cast<std::size_t>(seqlen));
  for (index_t h = 0; h < heads_q; ++h) {
    const index_t head_kv = h / (heads_q / heads_kv);
    double m = -INFINITY, sum = 0.0;
    for (index_t j = 0; j < seqlen; ++j) {
      double dot = 0.0;
      for (index_t e = 0; e < d; ++e)
        dot += double(Q[h * d + e]) * K[(j * heads_kv + head_kv) * d + e];
      m = std::max(m, P[j] = dot * scale);
    }
    for (index_t j = 0; j < seqlen; ++j) sum += P[j] = std::exp(P[j] - m);
    for (index_t e = 0; e < d; ++e) {
      double acc = 0.0;
      for (index_t j = 0; j < seqlen; ++j) acc += P[j] * V[(j * heads_kv + head_kv) * d + e];
      O[h * d + e] = seqlen > 0 ? acc / sum : 0.0;
    }
    LSE[h] = seqlen > 0 ? m + std::log(sum) : -INFINITY;
  }
}

// Runs one (cache_seqlen, page_size, d) case with num_splits 1, 3 and 7; prints one line.
bool check(index_t seqlen, index_t page_size, index_t d, std::mt19937& rng) {
  constexpr index_t heads_q = 8, heads_kv = 2, spare_pages = 3;
  constexpr double tolerance = 1e-5, split_tolerance = 1e-6;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random_vector = [&](index_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    std::generate(x.begin(), x.end(), [&] { return normal(rng); });
    return x;
  };
  const std::vector<float> Q = random_vector(heads_q * d);
  const std::vector<float> K = random_vector(seqlen * heads_kv * d);  // contiguous copies
  const std::vector<float> V = random_vector(seqlen * heads_kv * d);

  // A pool with spare pages, in shuffled order; every row the sequence does not own is NaN,
  // so reading past cache_seqlen or through a wrong page id poisons the result.
  const index_t used_pages = (seqlen + page_size - 1) / page_size;
  const index_t pool_pages = used_pages + spare_pages, row_floats = heads_kv * d;
  std::vector<std::int32_t> block_table(static_cast<std::size_t>(pool_pages));
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  block_table.resize(static_cast<std::size_t>(used_pages));
  std::vector<float> k_pages(static_cast<std::size_t>(pool_pages * page_size * row_floats), NAN);
  std::vector<float> v_pages(k_pages);
  for (index_t j = 0; j < seqlen; ++j) {
    const index_t pool_row = block_table[j / page_size] * page_size + j % page_size;
    std::copy_n(&K[j * row_floats], row_floats, &k_pages[pool_row * row_floats]);
    std::copy_n(&V[j * row_floats], row_floats, &v_pages[pool_row * row_floats]);
  }
  const paged_minimal::PagedKV kv{k_pages.data(), v_pages.data(), block_table.data(),
                                  seqlen, page_size, heads_kv, d};

  std::vector<double> O_ref(heads_q * d), LSE_ref(heads_q);
  naive_decode(Q, K, V, seqlen, heads_q, heads_kv, d, O_ref, LSE_ref);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  double err_o = 0.0, err_lse = 0.0, split_diff = 0.0;
  std::vector<float> O_one_split;
  for (index_t num_splits : {1, 3, 7}) {
    std::vector<float> O(heads_q * d, NAN), LSE(heads_q, NAN);  // poisoned: all must be written
    paged_minimal::paged_decode(Q.data(), kv, heads_q, scale, num_splits, O.data(), LSE.data());
    for (index_t x = 0; x < heads_q * d; ++x) err_o = std::max(err_o, abs_error(O[x], O_ref[x]));
    for (index_t h = 0; h < heads_q; ++h)
      err_lse = std::max(err_lse, abs_error(LSE[h], LSE_ref[h]));
    O.insert(O.end(), LSE.begin(), LSE.end());                   // compare O and LSE together
    if (num_splits == 1) O_one_split = O;
    if (num_splits == 7)
      for (std::size_t x = 0; x < O.size(); ++x)
        split_diff = std::max(split_diff, abs_error(O[x], O_one_split[x]));
  }
  const bool pass = err_o < tolerance && err_lse < tolerance && split_diff < split_tolerance;
  std::printf("%-6s seqlen=%-4td page_size=%-2td d=%-2td splits 1,3,7: max |O - ref| = %.2e  "
              "max |LSE - ref| = %.2e  max |splits 7 - splits 1| = %.2e\n",
              pass ? "ok" : "FAILED", seqlen, page_size, d, err_o, err_lse, split_diff);
  return pass;
}

}  // namespace

// heads_q = 8 on heads_kv = 2 (G = 4); 0 keys, 1 key, partial last pages, and more splits
// than pages (empty splits), on page sizes 16 and 5, head_dim 64 and 17.
int main() {
  std::mt19937 rng(2024);
  bool ok = true;
  for (index_t seqlen : {0, 1, 17, 127, 1000})
    for (index_t page_size : {16, 5})
      for (index_t d : {64, 17}) ok = check(seqlen, page_size, d, rng) && ok;
  std::printf(ok ? "all checks passed\n" : "error: some checks FAILED\n");
  return ok ? 0 : 1;
}
#endif
