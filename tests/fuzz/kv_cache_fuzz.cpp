// tests/fuzz/kv_cache_fuzz.cpp: libFuzzer harness for the paged KV cache manager
// tileattn::KvCache<T> and the slot writer tileattn::write_kv_slots.
//
// The fuzzer's bytes choose a storage type (float, bf16, int8, fp8 e4m3, fp8 e5m2), a small
// cache (1-3 layers, 1-8 pages so that running out happens, page size 1-17, 1-2 K/V heads,
// head_dim and head_dim_v 1-6, fp8 scales in each of the config's four forms, head- or
// token-major pages) or a bad config (a bad field, 2^40 layers or more), then up to 32
// operations, each valid or made
// invalid on purpose: create, fork,
// share_prefix (tokens out of range), extend (negative, past 2^31 - 1, out of pages), write
// of the last n positions and at a position0 (bad layer, n past the length, INT64_MAX, a shared page,
// rows of the wrong shape, null, negative strides or over the cache's pages), append (the
// same, and the wrong layer count), truncate (past the length, negative), free (twice),
// batch, pages_needed, the pool, scale and ref_count accessors (bad layer or page), an
// unknown or freed sequence id for each, forward_paged over a batch of live sequences, and
// write_kv_slots into a raw pool (slot -1, out of range, repeated, a wrong count, bad
// shapes, overlaps, V's pool on K's, and bad, broadcast or shared scales for 8-bit pools). Rows for 8-bit
// caches come in float, bf16 or fp16. A third of the writes, appends and raw writes rotate K
// (rotary tables of random sizes and layouts; a row short, a position past them, negative, or
// one too many, or positions without tables, on purpose now and then): the model keeps K
// rotated at each token's position as the definition says (tests/fuzz/fuzz_rotary.hpp),
// rounded to T, or in float before an 8-bit cache quantizes it. A quarter of the caches whose
// head_dim_v <= head_dim are latent (KvCacheConfig::latent, MLA): writes and appends go through
// write_latent / append_latent with K's rows (no rotary; V's row faults reach nothing), the
// model's V is K's first head_dim_v values, and attention is forward_paged_mla.
//
// Beside the cache runs a model: per live sequence its length, its pages and, per layer and
// position, the float rows written there (a position extend reserved and nothing wrote is
// unknown and never compared). The model predicts each call's outcome: success,
// tileattn::invalid_argument or tileattn::out_of_pages. A rejected call must name its
// parameter (fuzz::require_named) and leave everything as it was: every sequence's length
// and pages, every reference count and the free count, every pool and scale byte. After
// each operation the cache must match the model:
//   - lengths, and pages() equal to the model's block table, so ceil(length / page_size)
//     pages; pages taken by extend/append/copy-on-write are the lowest free ones (the
//     documented rule), so a page is shared only where fork or share_prefix shared it;
//   - ref_count(p) = the number of model sequences holding p, free_pages() = the pages
//     nobody holds;
//   - every written position read back through the sequence's pages: float and bf16
//     bitwise; fp8 bitwise equal to quantize(x, scale) at the config's fixed scale (the
//     documented rounding); int8 within (1 + r) / 2 units of the page's current scale, r
//     the tokens written into that page since (each raises the scale at most once, and
//     each requantization adds at most half a unit of a scale <= the current one: the
//     docs' "one unit after one requantization" generalised), and never int8_nan.
// forward_paged over live sequences (one query token, GQA group 1-2, split-KV forced or
// not, serial) must match the double-precision reference over the K/V it reads through the
// cache's block tables, dequantized (the rows just checked against the model): O within
// 1e-4 (1 + max |V|), the LSE within 1e-4 (1 + |LSE|). That is 5x the forward's fp32 bound
// of 2e-5 (N(0, 1) inputs, tests/support/test_support.hpp), which the paged and quantized
// suites meet at larger shapes; rows here are N(0, 1) times up to 3, head_dim <= 6. An
// empty sequence must give O = 0 and LSE = -inf.
// write_kv_slots on a raw pool (1-3 pages of the cache's shape) must reject or write
// exactly what the model writes: unwritten slots keep their zero bits, written ones as
// above (fp8 at the scale of that call, int8 within the same bound).
// Anything else aborts (a crash, a sanitizer report, another exception, a wrong state).
//
// The 4-bit tag (issue #42 item 7): an input that starts with "kc4b" draws a 4-bit cache,
// KvCache<q4_0_block>, <nvfp4_block>, <mxfp4_block> or <hadamard_rotated<q4_0_block>>
// (the byte after the tag, mod 4), and decodes the bytes after that byte with a provider
// of its own, so every other input decodes as before. Its config is read_config's with
// head_dim and head_dim_v 1 to 3 whole blocks (rotated: 1 or 2, powers of two), no scales,
// never latent; a bad one (now and then) has a head dim that is not whole blocks or (rotated)
// not a power of two, latent set, a scale, or one of the other bad fields. The operations
// are the same (rows in float, bf16 or fp16, rotary K included), and every written position
// must hold, bitwise, the codec's blocks of the model's row (K rotated by rotary in float;
// rotated caches: each row then turned by H), in the cache and in raw write_kv_slots pools
// (unwritten raw slots keep their zero bits); forward_paged over the cache (float Q; rotated
// pools: the kernel rotates Q and O) must match the double reference over the dequantized
// blocks (rotated: each row turned back by H) within the same bounds.
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target kv_cache_fuzz
//   build-fuzz/tests/fuzz/kv_cache_fuzz -max_len=1024 tests/fuzz/corpus/kv_cache -max_total_time=3600
// KV_CACHE_FUZZ_VERBOSE=1 prints the config and each operation with its outcome:
// build-fuzz/tests/fuzz/kv_cache_fuzz FILE...
// (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_rotary.hpp"
#include "fuzz/fuzz_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/paged.hpp"

namespace {

using namespace tileattn;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("kv_cache_fuzz", what); }

// The model and the checks are not what is fuzzed: coverage counters in their loops only
// multiply libFuzzer's features, and its bookkeeping per input (entropic scheduling) grows
// with them, so they go uninstrumented. ASan and UBSan still check them.
#define KV_CACHE_FUZZ_UNCOVERED __attribute__((no_sanitize("coverage")))

bool verbose = false;
KV_CACHE_FUZZ_UNCOVERED void say(const std::string& line) {
  if (verbose) std::fprintf(stderr, "kv_cache_fuzz: %s\n", line.c_str());
}

// Small enough that an input costs about a millisecond under ASan, large enough that pages
// run out, are shared, copied and reused.
constexpr index_t max_layers = 3, max_pages = 8, max_page_size = 17, max_heads_kv = 2, max_head_dim = 6;
constexpr int max_operations = 32, max_live = 6, max_batch = 3;
constexpr index_t max_raw_pages = 3;

// ---- The model -------------------------------------------------------------------------

/// What was written at one position of one layer (what a reader must get back).
struct Token {
  bool written = false;
  std::vector<float> k, v;  // [heads_kv * head_dim], [heads_kv * head_dim_v]
  std::vector<float> k_scale, v_scale;  // raw fp8 pools: the scale of each head when written
  int later = 0;                        // int8: tokens written into its page since
};

struct Sequence {
  index_t length = 0;
  std::vector<std::int32_t> pages;
  std::vector<std::vector<Token>> layers;  // [layer][position], `length` positions each
};

struct Model {
  index_t page_size = 1, num_pages = 1;
  std::map<SequenceId, Sequence> seqs;
  std::vector<SequenceId> freed;

  KV_CACHE_FUZZ_UNCOVERED index_t pages_for(index_t tokens) const { return (tokens + page_size - 1) / page_size; }
  KV_CACHE_FUZZ_UNCOVERED std::vector<index_t> ref_counts() const {
    std::vector<index_t> counts(static_cast<std::size_t>(num_pages), 0);
    for (const auto& [id, s] : seqs)
      for (std::int32_t p : s.pages) ++counts[static_cast<std::size_t>(p)];
    return counts;
  }
  /// The free pages, lowest first (extend takes them in that order).
  KV_CACHE_FUZZ_UNCOVERED std::vector<std::int32_t> free_list() const {
    const auto counts = ref_counts();
    std::vector<std::int32_t> out;
    for (std::size_t p = 0; p < counts.size(); ++p)
      if (counts[p] == 0) out.push_back(static_cast<std::int32_t>(p));
    return out;
  }
  /// extend(s, n)'s free pages: new ones, and a copy of a shared, partly filled last page.
  KV_CACHE_FUZZ_UNCOVERED index_t pages_needed(const Sequence& s, index_t n) const {
    if (n <= 0) return 0;
    const bool copy = s.length % page_size != 0 && ref_counts()[static_cast<std::size_t>(s.pages.back())] > 1;
    return pages_for(s.length + n) - static_cast<index_t>(s.pages.size()) + copy;
  }
  /// Whether positions [p0, p0 + n) of s lie within its length, in pages it holds alone.
  KV_CACHE_FUZZ_UNCOVERED bool writable(const Sequence& s, index_t p0, index_t n) const {
    if (p0 < 0 || n < 0 || p0 > s.length - n) return false;
    const auto counts = ref_counts();
    for (index_t t = p0; t < p0 + n; ++t)
      if (counts[static_cast<std::size_t>(s.pages[static_cast<std::size_t>(t / page_size)])] != 1) return false;
    return true;
  }
};

/// Records token rows written at `position` of a page-like row group: every other written
/// token of the group has one more later write (int8's bound), then the new one replaces it.
KV_CACHE_FUZZ_UNCOVERED void record(std::vector<Token>& group_rows, std::size_t position, const std::vector<std::size_t>& same_page,
            Token token) {
  for (std::size_t j : same_page)
    if (j != position && group_rows[j].written) ++group_rows[j].later;
  group_rows[position] = std::move(token);
}

// ---- Rows ------------------------------------------------------------------------------

/// New rows [layers, n, heads, dim] in S: N(0, 1) times a magnitude, contiguous or with a
/// gap after each head's values (strided rows).
template <class S>
struct Rows {
  std::vector<S> data;
  TensorView<const S> view;

  float value(index_t l, index_t t, index_t h, index_t c) const { return to_float(view(l, t, h, c)); }
  /// Layer l as the [n, heads, dim] view write() takes.
  StridedView<const S, 3> layer(index_t l) const {
    return {view.data + l * view.stride[0], {view.shape[1], view.shape[2], view.shape[3]},
            {view.stride[1], view.stride[2], view.stride[3]}};
  }
};

template <class S>
KV_CACHE_FUZZ_UNCOVERED Rows<S> make_rows(std::mt19937& rng, index_t layers, index_t n, index_t heads, index_t dim, bool padded, float magnitude) {
  Rows<S> r;
  const index_t dp = dim + (padded ? 2 : 0);
  r.data.resize(static_cast<std::size_t>(std::max<index_t>(layers * n * heads * dp, 1)));
  std::normal_distribution<float> normal;
  for (S& x : r.data) x = from_float<S>(normal(rng) * magnitude);
  r.view = {r.data.data(), {layers, n, heads, dim}, {n * heads * dp, heads * dp, dp, 1}};
  return r;
}

/// A latent cache's V: a copy of k whose view holds each row's first dim_v values.
template <class S>
KV_CACHE_FUZZ_UNCOVERED Rows<S> prefix_rows(const Rows<S>& k, index_t dim_v) {
  Rows<S> v;
  v.data = k.data;
  v.view = k.view;
  v.view.data = v.data.data();
  v.view.shape[3] = dim_v;
  return v;
}

/// Token t's rows of layer l, as the model keeps them.
template <class S>
KV_CACHE_FUZZ_UNCOVERED Token token_of(const Rows<S>& k, const Rows<S>& v, index_t l, index_t t) {
  Token tok;
  tok.written = true;
  for (index_t h = 0; h < k.view.shape[2]; ++h)
    for (index_t c = 0; c < k.view.shape[3]; ++c) tok.k.push_back(k.value(l, t, h, c));
  for (index_t h = 0; h < v.view.shape[2]; ++h)
    for (index_t c = 0; c < v.view.shape[3]; ++c) tok.v.push_back(v.value(l, t, h, c));
  return tok;
}

/// Bad new rows, one at a time (the operations that take rows draw one; 0 is none).
enum RowFault { no_fault, bad_heads, bad_dim, bad_dim_v, bad_tokens, bad_layers, null_rows, negative_stride,
                rows_over_pages, row_fault_count };
constexpr const char* row_fault_names[] = {"none", "heads", "head_dim", "head_dim_v", "tokens", "layers",
                                           "null", "negative stride", "over the pages"};

template <class S, int R>
void break_rows(RowFault f, StridedView<const S, R>& k, StridedView<const S, R>& v, const void* pages) {
  switch (f) {
    case bad_heads: k.shape[R - 2] += 1; break;
    case bad_dim: k.shape[R - 1] += 1; break;
    case bad_dim_v: v.shape[R - 1] += 1; break;
    case bad_tokens: v.shape[R - 3] += 1; break;
    case bad_layers: if constexpr (R == 4) k.shape[0] += 1, v.shape[0] += 1; break;
    case null_rows: v.data = nullptr; break;
    case negative_stride: k.stride[R - 1] = -1; break;
    case rows_over_pages: k.data = static_cast<const S*>(pages); break;  // never read: rejected first
    default: break;
  }
}

// ---- Checks of stored values -----------------------------------------------------------

template <class T>
bool same_bits_of(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Whether a stored element (at `scale`, 8-bit) holds written value x (file comment).
template <class T>
KV_CACHE_FUZZ_UNCOVERED bool holds(T got, float x, float scale, int later) {
  if constexpr (!quantized_type<T>) {
    return same_bits_of(got, from_float<T>(x));
  } else if constexpr (adaptive_scale<T>) {
    if (got == int8_nan) return false;
    const double err = std::abs(static_cast<double>(to_float(got)) * scale - x);
    return err <= 0.5 * (1 + later) * scale * (1 + 1e-5) + 1e-6 * std::abs(x);
  } else {
    return same_bits_of(got, quantize<T>(x, scale));
  }
}

/// Element c of head h of a stored row: [heads, dim] of a page pool at (page, row).
template <class T>
std::string describe_value(T got, float x, float scale) {
  return "holds " + std::to_string(to_float(got)) + " (scale " + std::to_string(scale) + "), written " +
         std::to_string(x);
}

// ---- The harness -----------------------------------------------------------------------

enum class Outcome { ok, invalid, out_of_pages };
constexpr const char* outcome_names[] = {"ok", "invalid_argument", "out_of_pages"};

template <class T>
class Harness {
  static constexpr bool quantized = quantized_type<T>;  // 8 bits, scales beside the pools
  static constexpr bool blocks = block_pool_type<T>;    // 4 bits (the 4-bit tag): blocks, scales inside
  static constexpr bool converts = quantized || blocks;  // rows arrive in float, bf16 or fp16
  static constexpr index_t per = values_per_element<T>;  // values per pool element (a block's count)

 public:
  Harness(FuzzedDataProvider& in, std::mt19937& rng, const KvCacheConfig& config)
      : in_(in), rng_(rng), cache_(config), c_(cache_.config()) {
    model_.page_size = c_.page_size;
    model_.num_pages = c_.num_pages;
    raw_pages_ = in_.ConsumeIntegralInRange<index_t>(1, max_raw_pages);
    raw_k_.assign(static_cast<std::size_t>(raw_pages_ * c_.page_size * c_.heads_kv * c_.head_dim / per), T{});
    raw_v_.assign(static_cast<std::size_t>(raw_pages_ * c_.page_size * c_.heads_kv * c_.head_dim_v / per), T{});
    raw_ks_.assign(static_cast<std::size_t>(raw_pages_ * c_.heads_kv), 0.0f);
    raw_vs_.assign(raw_ks_.size(), 0.0f);
    raw_tokens_.assign(static_cast<std::size_t>(raw_pages_ * c_.page_size), Token{});
  }

  void run() {
    const int operations = in_.ConsumeIntegralInRange(1, max_operations);
    for (int i = 0; i < operations && in_.remaining_bytes() > 0; ++i) {
      operation(in_.ConsumeIntegralInRange(0, 13));
      check_against_model();
    }
    attend();  // at the end, over whatever lives
  }

 private:
  // ---- Choosing arguments ----------------------------------------------------------------

  /// A live sequence, or (bad) a freed, never created or negative id. Sets `known`.
  SequenceId pick(bool bad, bool& known) {
    known = !bad && !model_.seqs.empty();
    if (known) {
      auto it = model_.seqs.begin();
      std::advance(it, in_.ConsumeIntegralInRange<std::size_t>(0, model_.seqs.size() - 1));
      return it->first;
    }
    switch (in_.ConsumeIntegralInRange(0, 2)) {
      case 0:
        if (!model_.freed.empty()) return model_.freed[in_.ConsumeIntegralInRange<std::size_t>(0, model_.freed.size() - 1)];
        [[fallthrough]];
      case 1: return 1000 + in_.ConsumeIntegral<std::uint8_t>();
      default: return -1 - in_.ConsumeIntegral<std::uint8_t>();
    }
  }
  /// About one call in four is made invalid on purpose.
  bool bad() { return in_.ConsumeIntegralInRange(0, 3) == 0; }
  float magnitude() {
    const float m[] = {1.0f, 0.25f, 3.0f, 1.0f};
    return m[in_.ConsumeIntegralInRange(0, 3)];
  }
  Sequence& seq(SequenceId id) { return model_.seqs.at(id); }

  // ---- Running a call against the model's prediction ---------------------------------------

  struct Snapshot {
    std::vector<std::vector<unsigned char>> bytes;  // pools and scales, every layer
    std::map<SequenceId, std::pair<index_t, std::vector<std::int32_t>>> seqs;
    std::vector<index_t> counts;
    index_t free = 0, sequences = 0;
    bool operator==(const Snapshot&) const = default;
  };

  template <class U>
  KV_CACHE_FUZZ_UNCOVERED static std::vector<unsigned char> bytes_of(const U* data, std::size_t count) {
    const auto* p = reinterpret_cast<const unsigned char*>(data);
    return {p, p + count * sizeof(U)};
  }

  KV_CACHE_FUZZ_UNCOVERED Snapshot snapshot() const {
    Snapshot s;
    const std::size_t rows = static_cast<std::size_t>(c_.num_pages * c_.page_size * c_.heads_kv);
    for (index_t l = 0; l < c_.num_layers; ++l) {
      s.bytes.push_back(bytes_of(cache_.k_pages(l).data, rows * static_cast<std::size_t>(c_.head_dim / per)));
      s.bytes.push_back(bytes_of(cache_.v_pages(l).data, rows * static_cast<std::size_t>(c_.head_dim_v / per)));
      if constexpr (quantized) {
        const std::size_t n = adaptive_scale<T> ? static_cast<std::size_t>(c_.num_pages * c_.heads_kv)
                                                : static_cast<std::size_t>(c_.heads_kv);
        s.bytes.push_back(bytes_of(cache_.k_scales(l).data, n));
        s.bytes.push_back(bytes_of(cache_.v_scales(l).data, n));
      }
    }
    for (const auto& [id, m] : model_.seqs)
      if (cache_.contains(id)) {
        const auto pages = cache_.pages(id);
        s.seqs[id] = {cache_.length(id), {pages.begin(), pages.end()}};
      }
    for (std::int32_t p = 0; p < c_.num_pages; ++p) s.counts.push_back(cache_.ref_count(p));
    s.free = cache_.free_pages();
    s.sequences = cache_.num_sequences();
    return s;
  }

  /// Runs `call`, which the model says ends in `expected`; a rejection must change nothing.
  /// Returns whether it succeeded.
  template <class F>
  bool attempt(const std::string& what, Outcome expected, F&& call) {
    Snapshot before;
    if (expected != Outcome::ok) before = snapshot();
    Outcome got = Outcome::ok;
    std::string message;
    try {
      call();
    } catch (const tileattn::invalid_argument& e) {
      fuzz::require_named("kv_cache_fuzz", e);
      got = Outcome::invalid;
      message = e.parameter();
    } catch (const tileattn::out_of_pages& e) {
      got = Outcome::out_of_pages;
      message = std::to_string(e.needed()) + " needed, " + std::to_string(e.available()) + " free";
    }
    say(what + " -> " + outcome_names[static_cast<int>(got)] + (message.empty() ? "" : " (" + message + ")"));
    if (got != expected)
      fail(what + ": expected " + outcome_names[static_cast<int>(expected)] + ", got " +
           outcome_names[static_cast<int>(got)] + (message.empty() ? "" : " (" + message + ")"));
    if (got != Outcome::ok && !(snapshot() == before)) fail(what + ": rejected, but changed the cache");
    return got == Outcome::ok;
  }

  // ---- Operations -------------------------------------------------------------------------

  void operation(int kind) {
    switch (kind) {
      case 0: create(); break;
      case 1: share(true); break;
      case 2: share(false); break;
      case 3: extend(); break;
      case 4: write(false); break;
      case 5: write(true); break;
      case 6: append(); break;
      case 7: truncate(); break;
      case 8: free(); break;
      case 9: batch(); break;
      case 10: pages_needed(); break;
      case 11: attend(); break;
      case 12: raw_write(); break;
      default: accessors(); break;
    }
  }

  void create() {
    if (static_cast<int>(model_.seqs.size()) >= max_live) return;
    const SequenceId id = cache_.create();
    say("create -> " + std::to_string(id));
    if (model_.seqs.count(id) || std::count(model_.freed.begin(), model_.freed.end(), id))
      fail("create returned id " + std::to_string(id) + ", which was used before");
    Sequence& s = model_.seqs[id];
    s.layers.resize(static_cast<std::size_t>(c_.num_layers));
  }

  /// fork (all tokens) or share_prefix (tokens from the input, maybe out of range).
  void share(bool whole) {
    if (static_cast<int>(model_.seqs.size()) >= max_live) return;
    bool known = false;
    const SequenceId src = pick(bad(), known);
    index_t tokens = 0;
    if (!whole) {
      const index_t len = known ? seq(src).length : 0;
      tokens = bad() ? (in_.ConsumeBool() ? -1 - in_.ConsumeIntegralInRange<index_t>(0, 3) : len + 1)
                     : in_.ConsumeIntegralInRange<index_t>(0, len);
    }
    const bool valid = known && (whole || (tokens >= 0 && tokens <= seq(src).length));
    SequenceId id = -1;
    const std::string what = whole ? "fork " + std::to_string(src)
                                   : "share_prefix " + std::to_string(src) + " tokens " + std::to_string(tokens);
    if (!attempt(what, valid ? Outcome::ok : Outcome::invalid,
                 [&] { id = whole ? cache_.fork(src) : cache_.share_prefix(src, tokens); }))
      return;
    say("  new sequence " + std::to_string(id));
    if (model_.seqs.count(id) || std::count(model_.freed.begin(), model_.freed.end(), id))
      fail(what + " returned id " + std::to_string(id) + ", which was used before");
    const Sequence& s = seq(src);
    const index_t n = whole ? s.length : tokens;
    Sequence child;
    child.length = n;
    child.pages.assign(s.pages.begin(), s.pages.begin() + model_.pages_for(n));
    for (const auto& layer : s.layers) child.layers.emplace_back(layer.begin(), layer.begin() + n);
    model_.seqs[id] = std::move(child);
  }

  /// The model's extend: the pages the cache took must be the lowest free ones, the pages
  /// before the last unchanged; the model adopts the cache's block table.
  void extend_model(SequenceId id, index_t n, const std::vector<std::int32_t>& free_before, index_t needed,
                    const std::string& what) {
    Sequence& s = seq(id);
    const auto pages = cache_.pages(id);
    const std::vector<std::int32_t> now(pages.begin(), pages.end());
    // needed = the new pages + a copy of the last page (copy-on-write): the copy replaces it.
    const index_t grow = model_.pages_for(s.length + n) - static_cast<index_t>(s.pages.size());
    const std::size_t kept = s.pages.size() - static_cast<std::size_t>(needed - grow);
    if (now.size() != static_cast<std::size_t>(model_.pages_for(s.length + n)) ||
        !std::equal(s.pages.begin(), s.pages.begin() + static_cast<std::ptrdiff_t>(kept), now.begin()))
      fail(what + ": the block table's old pages changed or it has the wrong size");
    std::vector<std::int32_t> taken(now.begin() + static_cast<std::ptrdiff_t>(kept), now.end());
    std::sort(taken.begin(), taken.end());
    if (static_cast<index_t>(taken.size()) != needed || !std::equal(taken.begin(), taken.end(), free_before.begin()))
      fail(what + ": did not take the " + std::to_string(needed) + " lowest free pages");
    s.pages = now;
    s.length += n;
    for (auto& layer : s.layers) layer.resize(static_cast<std::size_t>(s.length));  // unknown positions
  }

  void extend() {
    const bool fault = bad();
    bool known = false;
    const SequenceId id = pick(fault && in_.ConsumeBool(), known);
    index_t n = in_.ConsumeIntegralInRange<index_t>(0, 2 * c_.page_size + 1);
    if (fault && known) {
      const index_t bad_n[] = {-1, -(index_t{1} << 40), KvCache<T>::max_length, model_.num_pages * c_.page_size + 1};
      n = bad_n[in_.ConsumeIntegralInRange(0, 3)];
    }
    const std::string what = "extend " + std::to_string(id) + " n " + std::to_string(n);
    Outcome expected = Outcome::invalid;
    index_t needed = 0;
    if (known && n >= 0 && n <= KvCache<T>::max_length - seq(id).length) {
      needed = model_.pages_needed(seq(id), n);
      expected = needed > static_cast<index_t>(model_.free_list().size()) ? Outcome::out_of_pages : Outcome::ok;
    }
    const auto free_before = model_.free_list();
    if (attempt(what, expected, [&] { cache_.extend(id, n); })) extend_model(id, n, free_before, needed, what);
  }

  /// The row type of a write: T, or float, bf16 or fp16 for an 8-bit or 4-bit cache.
  template <class F>
  void with_row_type(F&& f) {
    if constexpr (converts) {
      switch (in_.ConsumeIntegralInRange(0, 2)) {
        case 0: f.template operator()<float>(); break;
        case 1: f.template operator()<bf16>(); break;
        default: f.template operator()<fp16>(); break;
      }
    } else {
      f.template operator()<T>();
    }
  }

  /// Whether fault f breaks rows the call takes: a latent cache's write_latent / append_latent
  /// take K's rows alone, so the faults of V's (head_dim_v, tokens, null) change nothing.
  bool faults_rows_passed(RowFault f) const {
    if (f == no_fault) return false;
    return !(c_.latent && (f == bad_dim_v || f == bad_tokens || f == null_rows));
  }

  /// A row fault (or none). Rows over the pages need a token: an empty view covers no byte.
  RowFault row_fault(bool fault, bool four_d, index_t tokens) {
    if (!fault) return no_fault;
    const auto f = static_cast<RowFault>(in_.ConsumeIntegralInRange(1, row_fault_count - 1));
    if ((f == bad_layers && !four_d) || (f == rows_over_pages && tokens == 0)) return bad_heads;
    return f;
  }

  /// Rotary tables for a write at positions [first, last] (a third of the writes, head_dim
  /// >= 2; none when `any` is false and nothing is drawn): enough rows and up to 2 more, or
  /// (may_break, a quarter of those) a row short, which makes the write invalid.
  struct WriteRotary {
    fuzz::RotaryTables tables;
    bool valid = true;
  };
  WriteRotary write_rotary(index_t first, index_t last, bool any, bool may_break) {
    WriteRotary r;
    if (c_.latent) return r;  // write_latent takes rows as they are (MLA's rotary dims are the last ones)
    if (c_.head_dim < 2 || in_.ConsumeIntegralInRange(0, 2) != 0) return r;
    const index_t half = in_.ConsumeIntegralInRange<index_t>(1, c_.head_dim / 2);
    index_t rows = (any ? last + 1 : 1) + in_.ConsumeIntegralInRange(0, 2);
    if (may_break && any && last >= 1 && first >= 0 && in_.ConsumeIntegralInRange(0, 3) == 0) {
      rows = last;  // the last position past the tables
      r.valid = false;
    }
    r.tables = fuzz::make_rotary_tables(in_, rng_, rows, half, /*allow_nan=*/false);
    return r;
  }

  /// A token's K as the cache stores it with rotary tables: each head's row rotated at
  /// `position`, rounded to T (an 8-bit or 4-bit cache rotates in float and quantizes:
  /// holds(), expected_block()).
  KV_CACHE_FUZZ_UNCOVERED void rotate_token(Token& tok, const RotaryOptions& r, index_t position) const {
    if (!r.enabled()) return;
    using R = std::conditional_t<converts, float, T>;
    for (index_t h = 0; h < c_.heads_kv; ++h) fuzz::rotate_reference<R>(r, tok.k.data() + h * c_.head_dim, position);
  }

  /// Writes the model's rows for tokens [p0, p0 + n) of layer l (K rotated when r is set).
  template <class S>
  void write_model(SequenceId id, index_t l, index_t p0, const Rows<S>& k, const Rows<S>& v, index_t rows_layer,
                   const RotaryOptions& r = {}) {
    auto& layer = seq(id).layers[static_cast<std::size_t>(l)];
    for (index_t t = 0; t < k.view.shape[1]; ++t) {
      const index_t pos = p0 + t, first = pos / c_.page_size * c_.page_size;
      std::vector<std::size_t> same_page;
      for (index_t j = first; j < std::min(first + c_.page_size, seq(id).length); ++j)
        same_page.push_back(static_cast<std::size_t>(j));
      Token tok = token_of(k, v, rows_layer, t);
      rotate_token(tok, r, pos);
      record(layer, static_cast<std::size_t>(pos), same_page, std::move(tok));
    }
  }

  /// write() of the last n positions, or (at) of n positions from a position0.
  void write(bool at) {
    const bool fault = bad();
    const int what_bad = fault ? in_.ConsumeIntegralInRange(0, 3) : -1;  // 0 id, 1 layer, 2 rows, 3 range
    bool known = false;
    const SequenceId id = pick(what_bad == 0, known);
    const index_t len = known ? seq(id).length : 0;
    index_t layer = in_.ConsumeIntegralInRange<index_t>(0, c_.num_layers - 1);
    if (what_bad == 1) layer = in_.ConsumeBool() ? -1 : c_.num_layers;
    index_t n = in_.ConsumeIntegralInRange<index_t>(0, std::min<index_t>(len, 2 * c_.page_size));
    index_t p0 = at ? in_.ConsumeIntegralInRange<index_t>(0, len - n) : len - n;
    if (what_bad == 3) {
      if (!at) n = len + 1;
      else if (in_.ConsumeBool()) p0 = -1;
      else p0 = in_.ConsumeBool() ? std::numeric_limits<index_t>::max() : len - n + 1;  // INT64_MAX: issue 27, N4
    }
    const RowFault rf = row_fault(what_bad == 2, false, n);
    const bool in_range = p0 >= 0 && n >= 0 && p0 <= len - n;
    const WriteRotary rot = write_rotary(p0, in_range ? p0 + n - 1 : 0, in_range && n > 0, true);
    const RotaryOptions& r = rot.tables.options;
    with_row_type([&]<class S>() {
      const Rows<S> k = make_rows<S>(rng_, 1, n, c_.heads_kv, c_.head_dim, in_.ConsumeBool(), magnitude());
      const Rows<S> v = c_.latent ? prefix_rows(k, c_.head_dim_v)
                                  : make_rows<S>(rng_, 1, n, c_.heads_kv, c_.head_dim_v, in_.ConsumeBool(), magnitude());
      StridedView<const S, 3> kv = k.layer(0), vv = v.layer(0);
      break_rows(rf, kv, vv, cache_.k_pages(0).data);
      const bool valid = known && layer >= 0 && layer < c_.num_layers && !faults_rows_passed(rf) &&
                         model_.writable(seq(id), p0, n) && rot.valid;
      const std::string what = std::string(at ? "write_at " : "write ") + std::to_string(id) + " layer " +
                               std::to_string(layer) + " position0 " + std::to_string(p0) + " n " + std::to_string(n) +
                               " rows " + type_name<S>() + " fault " + row_fault_names[rf] + " rotary " +
                               rot.tables.describe() + (rot.valid ? "" : " (a row short)");
      const bool done = attempt(what, valid ? Outcome::ok : Outcome::invalid, [&] {
        if (c_.latent && at) cache_.write_latent(layer, id, p0, kv);
        else if (c_.latent) cache_.write_latent(layer, id, kv);
        else if (at) cache_.write(layer, id, p0, kv, vv, r);
        else cache_.write(layer, id, kv, vv, r);
      });
      if (done) write_model(id, layer, p0, k, v, 0, r);
    });
  }

  void append() {
    const bool fault = bad();
    const bool bad_id = fault && in_.ConsumeBool();
    bool known = false;
    const SequenceId id = pick(bad_id, known);
    const index_t n = in_.ConsumeIntegralInRange<index_t>(0, 2 * c_.page_size + 1);
    const RowFault rf = row_fault(fault && !bad_id, true, n);
    const index_t p0 = known ? seq(id).length : 0;
    const WriteRotary rot = write_rotary(p0, p0 + n - 1, n > 0, true);
    const RotaryOptions& r = rot.tables.options;
    with_row_type([&]<class S>() {
      const Rows<S> k = make_rows<S>(rng_, c_.num_layers, n, c_.heads_kv, c_.head_dim, in_.ConsumeBool(), magnitude());
      const Rows<S> v = c_.latent ? prefix_rows(k, c_.head_dim_v)
                                  : make_rows<S>(rng_, c_.num_layers, n, c_.heads_kv, c_.head_dim_v, in_.ConsumeBool(), magnitude());
      TensorView<const S> kv = k.view, vv = v.view;
      break_rows(rf, kv, vv, cache_.v_pages(c_.num_layers - 1).data);
      Outcome expected = Outcome::invalid;
      index_t needed = 0;
      if (known && !faults_rows_passed(rf) && rot.valid) {  // (rotary is checked before the pages)
        needed = model_.pages_needed(seq(id), n);
        expected = needed > static_cast<index_t>(model_.free_list().size()) ? Outcome::out_of_pages : Outcome::ok;
      }
      const std::string what = "append " + std::to_string(id) + " n " + std::to_string(n) + " rows " + type_name<S>() +
                               " fault " + row_fault_names[rf] + " rotary " + rot.tables.describe() +
                               (rot.valid ? "" : " (a row short)");
      const auto free_before = model_.free_list();
      if (!attempt(what, expected, [&] {
            if (c_.latent) cache_.append_latent(id, kv);
            else cache_.append(id, kv, vv, r);
          }))
        return;
      extend_model(id, n, free_before, needed, what);
      for (index_t l = 0; l < c_.num_layers; ++l) write_model(id, l, p0, k, v, l, r);
    });
  }

  void truncate() {
    const bool fault = bad();
    bool known = false;
    const SequenceId id = pick(fault && in_.ConsumeBool(), known);
    const index_t len = known ? seq(id).length : 0;
    index_t new_length = in_.ConsumeIntegralInRange<index_t>(0, len);
    if (fault && known) new_length = in_.ConsumeBool() ? -1 : len + 1 + in_.ConsumeIntegralInRange<index_t>(0, 2);
    const bool valid = known && new_length >= 0 && new_length <= len;
    if (!attempt("truncate " + std::to_string(id) + " to " + std::to_string(new_length),
                 valid ? Outcome::ok : Outcome::invalid, [&] { cache_.truncate(id, new_length); }))
      return;
    Sequence& s = seq(id);
    s.length = new_length;
    s.pages.resize(static_cast<std::size_t>(model_.pages_for(new_length)));
    for (auto& layer : s.layers) layer.resize(static_cast<std::size_t>(new_length));
  }

  void free() {
    bool known = false;
    const SequenceId id = pick(bad(), known);
    if (!attempt("free " + std::to_string(id), known ? Outcome::ok : Outcome::invalid, [&] { cache_.free(id); }))
      return;
    model_.seqs.erase(id);
    model_.freed.push_back(id);
  }

  /// Up to max_batch sequences (repeats allowed), one maybe unknown.
  std::vector<SequenceId> pick_batch(bool fault, bool& all_known) {
    const int size = in_.ConsumeIntegralInRange(fault ? 1 : 0, max_batch);
    const int bad_at = fault ? in_.ConsumeIntegralInRange(0, size - 1) : -1;
    std::vector<SequenceId> ids;
    all_known = true;
    for (int b = 0; b < size; ++b) {
      bool known = false;
      ids.push_back(pick(b == bad_at, known));
      all_known &= known;
    }
    return ids;
  }

  /// batch()'s tables against the model: rows padded with page 0, max_pages >= 1.
  KV_CACHE_FUZZ_UNCOVERED void check_tables(const typename KvCache<T>::BatchTables& t, const std::vector<SequenceId>& ids) {
    index_t width = 1;
    for (SequenceId id : ids) width = std::max(width, static_cast<index_t>(seq(id).pages.size()));
    if (t.max_pages != width || t.block_table.size() != ids.size() * static_cast<std::size_t>(width) ||
        t.cache_seqlens.size() != ids.size())
      fail("batch: tables of the wrong size");
    for (std::size_t b = 0; b < ids.size(); ++b) {
      const Sequence& s = seq(ids[b]);
      if (t.cache_seqlens[b] != s.length) fail("batch: wrong cache_seqlens");
      for (index_t j = 0; j < width; ++j) {
        const std::size_t at = b * static_cast<std::size_t>(width) + static_cast<std::size_t>(j);
        const std::int32_t want = j < static_cast<index_t>(s.pages.size()) ? s.pages[static_cast<std::size_t>(j)] : 0;
        if (t.block_table[at] != want) fail("batch: wrong block table entry");
      }
    }
  }

  void batch() {
    bool all_known = false;
    const std::vector<SequenceId> ids = pick_batch(bad(), all_known);
    typename KvCache<T>::BatchTables t;
    if (attempt("batch of " + std::to_string(ids.size()), all_known ? Outcome::ok : Outcome::invalid,
                [&] { t = cache_.batch(ids); }))
      check_tables(t, ids);
  }

  void pages_needed() {
    bool known = false;
    const SequenceId id = pick(bad(), known);
    const index_t n = in_.ConsumeIntegralInRange<index_t>(-2, 3 * c_.page_size);
    index_t got = -1;
    if (attempt("pages_needed " + std::to_string(id) + " n " + std::to_string(n),
                known ? Outcome::ok : Outcome::invalid, [&] { got = cache_.pages_needed(id, n); }) &&
        got != model_.pages_needed(seq(id), n))
      fail("pages_needed returned " + std::to_string(got) + ", the model needs " +
           std::to_string(model_.pages_needed(seq(id), n)));
  }

  /// The const accessors with a bad layer or page (a good one is used by every check).
  void accessors() {
    const index_t layer = in_.ConsumeBool() ? -1 : c_.num_layers;
    const auto page = static_cast<std::int32_t>(in_.ConsumeBool() ? -1 : c_.num_pages);
    const KvCache<T>& cache = cache_;
    switch (in_.ConsumeIntegralInRange(0, 3)) {
      case 0: attempt("k_pages layer " + std::to_string(layer), Outcome::invalid, [&] { (void)cache.k_pages(layer); }); break;
      case 1: attempt("v_pages layer " + std::to_string(layer), Outcome::invalid, [&] { (void)cache_.v_pages(layer); }); break;
      case 2: attempt("ref_count page " + std::to_string(page), Outcome::invalid, [&] { (void)cache.ref_count(page); }); break;
      default:
        if constexpr (quantized)
          attempt("k_scales/v_scales layer " + std::to_string(layer), Outcome::invalid, [&] {
            if (in_.ConsumeBool()) (void)cache.k_scales(layer);
            else (void)cache.v_scales(layer);
          });
        break;
    }
  }

  // ---- The cache against the model ------------------------------------------------------

  /// The scale of (page, head) in layer l's K (kv 0) or V pool; 1 for 16- and 32-bit caches.
  KV_CACHE_FUZZ_UNCOVERED float scale_of(index_t l, int kv, std::int32_t page, index_t h) const {
    if constexpr (quantized) {
      const KvScaleView s = kv == 0 ? cache_.k_scales(l) : cache_.v_scales(l);
      return s(adaptive_scale<T> ? page : 0, h);
    } else {
      return 1.0f;
    }
  }

  KV_CACHE_FUZZ_UNCOVERED void check_contents(SequenceId id, const Sequence& s) const {
    for (index_t l = 0; l < c_.num_layers; ++l)
      for (index_t t = 0; t < s.length; ++t) {
        const Token& tok = s.layers[static_cast<std::size_t>(l)][static_cast<std::size_t>(t)];
        if (!tok.written) continue;
        const std::int32_t page = s.pages[static_cast<std::size_t>(t / c_.page_size)];
        const index_t row = t % c_.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          const auto pool = kv == 0 ? cache_.k_pages(l) : cache_.v_pages(l);
          if constexpr (blocks) {
            check_blocks(kv == 0 ? tok.k : tok.v, kv == 0 ? c_.head_dim : c_.head_dim_v, [&](index_t h, index_t blk) {
              return pool(page, row, h, blk);
            }, [&] {
              return "sequence " + std::to_string(id) + " layer " + std::to_string(l) + " position " + std::to_string(t) +
                     (kv == 0 ? " K" : " V") + " (page " + std::to_string(page) + ")";
            });
          } else {
          const index_t dim = pool.shape[3];
          for (index_t h = 0; h < c_.heads_kv; ++h) {
            const float scale = scale_of(l, kv, page, h);
            for (index_t c = 0; c < dim; ++c) {
              const float x = (kv == 0 ? tok.k : tok.v)[static_cast<std::size_t>(h * dim + c)];
              const T got = pool(page, row, h, c);
              if (!holds(got, x, scale, tok.later))
                fail("sequence " + std::to_string(id) + " layer " + std::to_string(l) + " position " +
                     std::to_string(t) + (kv == 0 ? " K" : " V") + " head " + std::to_string(h) + " element " +
                     std::to_string(c) + " (page " + std::to_string(page) + ") " + describe_value(got, x, scale) +
                     ", " + std::to_string(tok.later) + " later writes into its page");
            }
          }
          }
        }
      }
  }

  /// 4-bit caches: the blocks a written row of `dim` values per head must be stored as:
  /// each head's row (K already rotated by rotary, in float) turned by H when the cache is
  /// hadamard_rotated, then quantized block by block by the codec (core/
  /// block_quantized_types.hpp). Bitwise: the codec is deterministic.
  KV_CACHE_FUZZ_UNCOVERED std::vector<stored_block_t<T>> expected_blocks(const std::vector<float>& values, index_t dim) const
    requires blocks
  {
    using B = stored_block_t<T>;
    std::vector<B> out;
    std::vector<float> row(static_cast<std::size_t>(dim));
    for (index_t h = 0; h < c_.heads_kv; ++h) {
      std::copy_n(values.begin() + h * dim, dim, row.begin());
      if constexpr (is_hadamard_rotated<T>) ops::hadamard_row(row.data(), dim);
      for (index_t blk = 0; blk < dim / per; ++blk) out.push_back(quantize_block<B>(row.data() + blk * per));
    }
    return out;
  }

  /// A written row of a 4-bit cache (stored(h, blk) its blocks) against the model's values;
  /// on a mismatch, the values each block dequantizes to.
  template <class Stored, class Where>
  KV_CACHE_FUZZ_UNCOVERED void check_blocks(const std::vector<float>& values, index_t dim, Stored&& stored, Where&& where) const
    requires blocks
  {
    const auto want = expected_blocks(values, dim);
    for (index_t h = 0; h < c_.heads_kv; ++h)
      for (index_t blk = 0; blk < dim / per; ++blk) {
        const T got = stored(h, blk);
        const auto& expected = want[static_cast<std::size_t>(h * (dim / per) + blk)];
        if (std::memcmp(&got, &expected, sizeof(T)) == 0) continue;
        float g[per], e[per];
        dequantize_block(reinterpret_cast<const stored_block_t<T>&>(got), g);
        dequantize_block(expected, e);
        std::string s = where() + " head " + std::to_string(h) + " block " + std::to_string(blk) + " (" +
                        kv_type_name<T>() + ") dequantizes to";
        for (float x : g) s += " " + std::to_string(x);
        s += ", the model's row quantizes to";
        for (float x : e) s += " " + std::to_string(x);
        fail(s);
      }
  }

  KV_CACHE_FUZZ_UNCOVERED void check_against_model() const {
    if (cache_.num_sequences() != static_cast<index_t>(model_.seqs.size()))
      fail("num_sequences " + std::to_string(cache_.num_sequences()) + ", the model has " +
           std::to_string(model_.seqs.size()));
    for (SequenceId id : model_.freed)
      if (cache_.contains(id)) fail("freed sequence " + std::to_string(id) + " is still there");
    for (const auto& [id, s] : model_.seqs) {
      if (!cache_.contains(id) || cache_.length(id) != s.length) fail("sequence " + std::to_string(id) + ": wrong length");
      const auto pages = cache_.pages(id);
      if (!std::equal(pages.begin(), pages.end(), s.pages.begin(), s.pages.end()))
        fail("sequence " + std::to_string(id) + ": pages differ from the model's block table");
      check_contents(id, s);
    }
    const auto counts = model_.ref_counts();
    for (std::int32_t p = 0; p < c_.num_pages; ++p)
      if (cache_.ref_count(p) != counts[static_cast<std::size_t>(p)])
        fail("page " + std::to_string(p) + " has reference count " + std::to_string(cache_.ref_count(p)) + ", held by " +
             std::to_string(counts[static_cast<std::size_t>(p)]) + " sequences");
    if (cache_.free_pages() != static_cast<index_t>(model_.free_list().size()))
      fail("free_pages " + std::to_string(cache_.free_pages()) + ", the model has " +
           std::to_string(model_.free_list().size()));
  }

  // ---- forward_paged over live sequences --------------------------------------------------

  /// Sequence b's K (kv 0) or V [1, length, heads_kv, dim] read through its pages, dequantized.
  KV_CACHE_FUZZ_UNCOVERED std::vector<float> gather(const Sequence& s, index_t l, int kv) const {
    const auto pool = kv == 0 ? cache_.k_pages(l) : cache_.v_pages(l);
    const index_t dim = pool.shape[3] * per;
    std::vector<float> out;
    for (index_t t = 0; t < s.length; ++t) {
      const std::int32_t page = s.pages[static_cast<std::size_t>(t / c_.page_size)];
      for (index_t h = 0; h < c_.heads_kv; ++h)
        if constexpr (blocks) {  // each block's values; rotated: the row turned back by H (its own inverse)
          const std::size_t first = out.size();
          out.resize(first + static_cast<std::size_t>(dim));
          for (index_t blk = 0; blk < pool.shape[3]; ++blk)
            dequantize_block(reinterpret_cast<const stored_block_t<T>&>(pool(page, t % c_.page_size, h, blk)),
                             out.data() + first + blk * per);
          if constexpr (is_hadamard_rotated<T>) ops::hadamard_row(out.data() + first, dim);
        } else {
          for (index_t c = 0; c < dim; ++c)
            out.push_back(to_float(pool(page, t % c_.page_size, h, c)) * scale_of(l, kv, page, h));
        }
    }
    out.resize(std::max<std::size_t>(out.size(), 1));
    return out;
  }

  void attend() {
    if (model_.seqs.empty()) return;
    bool all_known = false;
    std::vector<SequenceId> ids = pick_batch(false, all_known);
    if (ids.empty()) ids.push_back(model_.seqs.begin()->first);
    const auto tables = cache_.batch(ids);
    check_tables(tables, ids);
    const auto B = static_cast<index_t>(ids.size());
    const index_t l = in_.ConsumeIntegralInRange<index_t>(0, c_.num_layers - 1);
    const index_t H = c_.heads_kv * in_.ConsumeIntegralInRange<index_t>(1, 2), D = c_.head_dim, Dv = c_.head_dim_v;
    // Q and O in T for a 16/32-bit cache (the kernel wants them alike), float for 8-bit and 4-bit.
    using Q = std::conditional_t<converts, float, T>;
    std::vector<Q> q(static_cast<std::size_t>(B * H * D)), o(static_cast<std::size_t>(B * H * Dv), from_float<Q>(test::sentinel));
    std::vector<float> lse(static_cast<std::size_t>(B * H), test::sentinel);
    std::normal_distribution<float> normal;
    for (Q& x : q) x = from_float<Q>(normal(rng_));
    std::vector<float> qf, of;  // exact float copies, for the reference
    for (Q x : q) qf.push_back(to_float(x));
    PagedOptions opt;
    opt.execution = {Backend::serial, 1};
    opt.num_splits = in_.ConsumeIntegralInRange<index_t>(0, 3);
    if constexpr (quantized) {
      opt.k_scale = cache_.k_scales(l);
      if (!c_.latent) opt.v_scale = cache_.v_scales(l);  // (a latent's V: K's scales)
    }
    say(std::string(c_.latent ? "forward_paged_mla" : "forward_paged") + " layer " + std::to_string(l) + " batch " +
        std::to_string(B) + " heads " + std::to_string(H) + " splits " + std::to_string(opt.num_splits));
    const auto both_pools = [&] {
      forward_paged(make_bshd<const Q>(q.data(), B, 1, H, D), cache_.k_pages(l), cache_.v_pages(l),
                    tables.block_table_view(), tables.seqlens(), make_bshd(o.data(), B, 1, H, Dv),
                    make_lse(lse.data(), B, H, 1), opt);
    };
    if constexpr (blocks)  // (never latent: forward_paged_mla takes no 4-bit pools)
      both_pools();
    else if (c_.latent)
      forward_paged_mla(make_bshd<const Q>(q.data(), B, 1, H, D), cache_.k_pages(l), tables.block_table_view(),
                        tables.seqlens(), make_bshd(o.data(), B, 1, H, Dv), make_lse(lse.data(), B, H, 1), opt);
    else
      both_pools();
    for (Q x : o) of.push_back(to_float(x));
    for (index_t b = 0; b < B; ++b) {
      const Sequence& s = seq(ids[static_cast<std::size_t>(b)]);
      const std::vector<float> k = gather(s, l, 0), v = gather(s, l, 1);
      const auto ref = reference::attention(make_bshd<const float>(qf.data() + b * H * D, 1, 1, H, D),
                                            make_bshd<const float>(k.data(), 1, s.length, c_.heads_kv, D),
                                            make_bshd<const float>(v.data(), 1, s.length, c_.heads_kv, Dv),
                                            test::default_scale(D), false);
      const test::Deviation dev = test::compare_to_reference(
          ref, make_bshd<const float>(of.data() + b * H * Dv, 1, 1, H, Dv), make_lse(lse.data() + b * H, 1, H, 1));
      double max_v = 0.0, max_lse = 0.0;
      for (float x : v) max_v = std::max(max_v, std::abs(static_cast<double>(x)));
      for (double x : ref.lse)
        if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
      // bf16 O is rounded once when stored: 2^-8 |O| <= 2^-8 max |V| more (file comment).
      const double o_bound = 1e-4 * (1 + max_v) + (std::is_same_v<Q, bf16> ? 0x1p-8 * max_v : 0.0);
      const double lse_bound = 1e-4 * (1 + max_lse);
      const std::string where = "forward_paged, sequence " + std::to_string(ids[static_cast<std::size_t>(b)]) +
                                " (length " + std::to_string(s.length) + ") of a batch of " + std::to_string(B) +
                                ", layer " + std::to_string(l);
      if (!dev.problem.empty()) fail(where + ": " + dev.problem);
      if (dev.o > o_bound || dev.lse > lse_bound)
        fail(where + ": error " + std::to_string(dev.o) + " on O (bound " + std::to_string(o_bound) + "), " +
             std::to_string(dev.lse) + " on the LSE (bound " + std::to_string(lse_bound) + ")");
    }
  }

  // ---- write_kv_slots on a raw pool -------------------------------------------------------

  /// Scales for one raw write: int8 the pool's own [pages, heads]; fp8 fresh values, per
  /// tensor, per head or per (page, head), each a power of two or not.
  struct RawScales {
    std::vector<float> k, v;  // fp8 only
    PageScaleView kv, vv;
  };

  RawScales raw_scales() {
    RawScales r;
    if constexpr (adaptive_scale<T>) {
      r.kv = make_page_scales(raw_ks_.data(), raw_pages_, c_.heads_kv);
      r.vv = make_page_scales(raw_vs_.data(), raw_pages_, c_.heads_kv);
    } else {
      const int form = in_.ConsumeIntegralInRange(0, 2);
      const index_t rows = form == 2 ? raw_pages_ : 1, cols = form == 0 ? 1 : c_.heads_kv;
      for (auto* s : {&r.k, &r.v}) {
        s->resize(static_cast<std::size_t>(rows * cols));
        for (float& x : *s)
          x = in_.ConsumeBool() ? std::ldexp(1.0f, in_.ConsumeIntegralInRange(-4, 2))
                                : in_.ConsumeFloatingPointInRange(0.05f, 4.0f);
      }
      r.kv = {r.k.data(), {rows, cols}, {cols, 1}};
      r.vv = {r.v.data(), {rows, cols}, {cols, 1}};
    }
    return r;
  }

  /// A scale fault that makes the call invalid only if it touches a page the call writes
  /// (check_page_scales checks those), or a view fault that always does. Returns whether
  /// the call stays valid.
  bool break_scales(RawScales& r, const std::vector<std::int64_t>& slots) {
    const int kind = in_.ConsumeIntegralInRange(0, 3);
    PageScaleView& view = in_.ConsumeBool() ? r.kv : r.vv;
    switch (kind) {
      case 0: view.shape[0] = raw_pages_ + 1; return false;     // neither 1 nor num_pages
      case 1: view.shape[1] = c_.heads_kv + 1; return false;
      case 2:
        if constexpr (adaptive_scale<T>) {
          r.vv.data = r.kv.data;  // one buffer for K and V scales
          return false;
        } else {
          view.data = reinterpret_cast<float*>(raw_k_.data());  // over the pool
          return false;
        }
      default: {
        // A bad value (negative, NaN, Inf; fp8 also 0) at one entry.
        const index_t page = in_.ConsumeIntegralInRange<index_t>(0, view.shape[0] - 1);
        const index_t h = in_.ConsumeIntegralInRange<index_t>(0, view.shape[1] - 1);
        const float bad_values[] = {-1.0f, fuzz::nan, fuzz::inf, 0.0f};
        const float value = bad_values[in_.ConsumeIntegralInRange(0, adaptive_scale<T> ? 2 : 3)];
        if constexpr (adaptive_scale<T>) {  // the pool's own scales: raw_write restores the entry
          restore_ = {&view(page, h), view(page, h)};
          view(page, h) = value;
          return std::none_of(slots.begin(), slots.end(),
                              [&](std::int64_t s) { return s >= 0 && s / c_.page_size == page; });
        } else {
          view(page, h) = value;
          if (view.shape[0] == 1) return !std::any_of(slots.begin(), slots.end(), [](std::int64_t s) { return s >= 0; });
          return std::none_of(slots.begin(), slots.end(),
                              [&](std::int64_t s) { return s >= 0 && s / c_.page_size == page; });
        }
      }
    }
  }

  void raw_write() {
    const index_t slots_total = raw_pages_ * c_.page_size;
    const index_t n = in_.ConsumeIntegralInRange<index_t>(0, 5);
    const bool fault = bad();
    const int fault_kind = fault ? in_.ConsumeIntegralInRange(0, quantized ? 4 : 3) : -1;  // 0 slots, 1 count, 2 rows, 3 pools, 4 scales
    std::vector<std::int64_t> slots;
    for (index_t i = 0; i < n; ++i)
      slots.push_back(in_.ConsumeIntegralInRange(0, 4) == 0 ? -1 : in_.ConsumeIntegralInRange<std::int64_t>(0, slots_total - 1));
    if (fault_kind == 0) {
      const std::int64_t bad_slots[] = {-2, slots_total, std::numeric_limits<std::int64_t>::max(),
                                        std::numeric_limits<std::int64_t>::min()};
      slots.push_back(bad_slots[in_.ConsumeIntegralInRange(0, 3)]);
    }
    if (fault_kind == 1) slots.push_back(-1);  // one more slot than tokens
    const index_t tokens = static_cast<index_t>(slots.size()) - (fault_kind == 1);
    bool valid = fault_kind < 0 || fault_kind == 4;
    std::set<std::int64_t> used;
    for (std::int64_t s : slots) {
      if (s < -1 || s >= slots_total) valid = false;
      if (s >= 0 && !used.insert(s).second) valid = false;  // repeated: documented as invalid
    }
    // Rotary K (a third of the writes): a position per token in the tables (a skipped
    // token's anything: never read), or one bad on purpose (a quarter of those).
    const index_t table_rows = in_.ConsumeIntegralInRange<index_t>(1, 9);
    const WriteRotary rot = write_rotary(0, table_rows - 1, true, false);
    const RotaryOptions& r = rot.tables.options;
    std::vector<std::int64_t> positions;
    std::string rotary_fault;
    if (r.enabled()) {
      for (index_t i = 0; i < tokens; ++i)
        positions.push_back(slots[static_cast<std::size_t>(i)] < 0 ? -1 - in_.ConsumeIntegralInRange(0, 5)
                                                                   : in_.ConsumeIntegralInRange<index_t>(0, r.cos.shape[0] - 1));
      if (in_.ConsumeIntegralInRange(0, 3) == 0) {
        const auto written = std::find_if(slots.begin(), slots.begin() + tokens, [](std::int64_t x) { return x >= 0; });
        switch (in_.ConsumeIntegralInRange(0, 2)) {
          case 0: positions.push_back(0); rotary_fault = "one position too many"; break;
          case 1:
            if (written == slots.begin() + tokens) break;
            positions[static_cast<std::size_t>(written - slots.begin())] = r.cos.shape[0];
            rotary_fault = "a position past the tables";
            break;
          default:
            if (written == slots.begin() + tokens) break;
            positions[static_cast<std::size_t>(written - slots.begin())] = -1;
            rotary_fault = "a negative position";
        }
      }
    } else if (tokens > 0 && in_.ConsumeIntegralInRange(0, 15) == 0) {
      positions.assign(static_cast<std::size_t>(tokens), 0);
      rotary_fault = "positions without tables";
    }
    if (!rotary_fault.empty()) valid = false;
    with_row_type([&]<class S>() {
      const Rows<S> k = make_rows<S>(rng_, 1, tokens, c_.heads_kv, c_.head_dim, in_.ConsumeBool(), magnitude());
      const Rows<S> v = make_rows<S>(rng_, 1, tokens, c_.heads_kv, c_.head_dim_v, in_.ConsumeBool(), magnitude());
      StridedView<const S, 3> kv = k.layer(0), vv = v.layer(0);
      const RowFault rf = row_fault(fault_kind == 2, false, tokens);
      break_rows(rf, kv, vv, raw_v_.data());
      PagePoolView<T> kp = make_page_pool(raw_k_.data(), raw_pages_, c_.page_size, c_.heads_kv, c_.head_dim / per);
      PagePoolView<T> vp = make_page_pool(raw_v_.data(), raw_pages_, c_.page_size, c_.heads_kv, c_.head_dim_v / per);
      if (fault_kind == 3) {
        switch (in_.ConsumeIntegralInRange(0, 3)) {
          case 0: vp.shape[1] = c_.page_size + 1; break;  // page sizes differ
          case 1:                                         // pages over one another
            if (raw_pages_ > 1) kp.stride[0] = 0;
            else kp.data = nullptr;
            break;
          case 2: vp.shape[0] = raw_pages_ + 1; break;    // page counts differ
          default:                                        // V's pages on K's (issue 27, N2)
            if (c_.head_dim_v <= c_.head_dim) vp = {kp.data, {raw_pages_, c_.page_size, c_.heads_kv, c_.head_dim_v / per}, kp.stride};
            else kp = {vp.data, {raw_pages_, c_.page_size, c_.heads_kv, c_.head_dim / per}, vp.stride};
            break;
        }
      }
      RawScales scales;
      if constexpr (quantized) scales = raw_scales();
      if (fault_kind == 4) valid = break_scales(scales, slots) && valid;
      const std::string what = "write_kv_slots " + std::to_string(tokens) + " tokens to" +
                               [&] {
                                 std::string s;
                                 for (auto x : slots) s += " " + std::to_string(x);
                                 return s;
                               }() +
                               " rows " + type_name<S>() + " fault " + std::to_string(fault_kind) + "/" +
                               row_fault_names[rf] + " rotary " + rot.tables.describe() + " " + rotary_fault;
      const auto before_k = raw_k_, before_v = raw_v_;
      const auto before_ks = raw_ks_, before_vs = raw_vs_;
      bool threw = false;
      try {
        if constexpr (quantized) write_kv_slots(kv, vv, kp, vp, slots, scales.kv, scales.vv, r, positions);
        else write_kv_slots(kv, vv, kp, vp, slots, r, positions);
      } catch (const tileattn::invalid_argument& e) {
        fuzz::require_named("kv_cache_fuzz", e);
        say(what + " -> invalid_argument (" + e.parameter() + ")");
        threw = true;
      }
      if (!threw) say(what + " -> ok");
      if (threw == (valid && rf == no_fault))
        fail(what + (threw ? ": rejected a valid call" : ": accepted an invalid call"));
      if (threw) {
        if (!fuzz::same_bits(before_k, raw_k_) || !fuzz::same_bits(before_v, raw_v_) ||
            !fuzz::same_bits(before_ks, raw_ks_) || !fuzz::same_bits(before_vs, raw_vs_))
          fail(what + ": rejected, but wrote into the pool or its scales");
      }
      if (restore_.first) *restore_.first = restore_.second, restore_ = {};
      if (threw) return;
      for (index_t i = 0; i < tokens; ++i) {
        const std::int64_t slot = slots[static_cast<std::size_t>(i)];
        if (slot < 0) continue;
        const index_t first = slot / c_.page_size * c_.page_size;
        std::vector<std::size_t> same_page;
        for (index_t j = first; j < first + c_.page_size; ++j) same_page.push_back(static_cast<std::size_t>(j));
        Token tok = token_of(k, v, 0, i);
        rotate_token(tok, r, r.enabled() ? positions[static_cast<std::size_t>(i)] : 0);
        if constexpr (quantized && !adaptive_scale<T>)
          for (index_t h = 0; h < c_.heads_kv; ++h) {
            const index_t page = slot / c_.page_size;
            tok.k_scale.push_back(scales.kv(scales.kv.shape[0] == 1 ? 0 : page, scales.kv.shape[1] == 1 ? 0 : h));
            tok.v_scale.push_back(scales.vv(scales.vv.shape[0] == 1 ? 0 : page, scales.vv.shape[1] == 1 ? 0 : h));
          }
        record(raw_tokens_, static_cast<std::size_t>(slot), same_page, std::move(tok));
      }
      check_raw_pool(what);
    });
  }

  /// The raw pool against the model: unwritten slots keep their zero bits.
  KV_CACHE_FUZZ_UNCOVERED void check_raw_pool(const std::string& what) const {
    if constexpr (blocks) check_raw_blocks(what);
    else check_raw_elements(what);
  }

  KV_CACHE_FUZZ_UNCOVERED void check_raw_elements(const std::string& what) const {
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<T>& pool = kv == 0 ? raw_k_ : raw_v_;
      const index_t dim = kv == 0 ? c_.head_dim : c_.head_dim_v;
      for (index_t slot = 0; slot < raw_pages_ * c_.page_size; ++slot) {
        const Token& tok = raw_tokens_[static_cast<std::size_t>(slot)];
        for (index_t h = 0; h < c_.heads_kv; ++h) {
          float scale = 1.0f;
          if constexpr (adaptive_scale<T>)
            scale = (kv == 0 ? raw_ks_ : raw_vs_)[static_cast<std::size_t>(slot / c_.page_size * c_.heads_kv + h)];
          else if constexpr (quantized)
            if (tok.written) scale = (kv == 0 ? tok.k_scale : tok.v_scale)[static_cast<std::size_t>(h)];
          for (index_t c = 0; c < dim; ++c) {
            const T got = pool[static_cast<std::size_t>((slot * c_.heads_kv + h) * dim + c)];
            const bool good = tok.written ? holds(got, (kv == 0 ? tok.k : tok.v)[static_cast<std::size_t>(h * dim + c)],
                                                  scale, tok.later)
                                          : same_bits_of(got, T{});
            if (!good)
              fail(what + ": raw pool slot " + std::to_string(slot) + (kv == 0 ? " K" : " V") + " head " +
                   std::to_string(h) + " element " + std::to_string(c) + " holds " + std::to_string(to_float(got)) +
                   (tok.written ? ", written " + std::to_string((kv == 0 ? tok.k : tok.v)[static_cast<std::size_t>(h * dim + c)])
                                : ", never written"));
          }
        }
      }
    }
  }

  /// A 4-bit raw pool against the model: written slots hold the codec's blocks of the
  /// model's rows, bitwise; unwritten ones their zero bits.
  KV_CACHE_FUZZ_UNCOVERED void check_raw_blocks(const std::string& what) const
    requires blocks
  {
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<T>& pool = kv == 0 ? raw_k_ : raw_v_;
      const index_t dim = kv == 0 ? c_.head_dim : c_.head_dim_v;
      for (index_t slot = 0; slot < raw_pages_ * c_.page_size; ++slot) {
        const Token& tok = raw_tokens_[static_cast<std::size_t>(slot)];
        const auto stored = [&](index_t h, index_t blk) {
          return pool[static_cast<std::size_t>((slot * c_.heads_kv + h) * (dim / per) + blk)];
        };
        const auto where = [&] { return what + ": raw pool slot " + std::to_string(slot) + (kv == 0 ? " K" : " V"); };
        if (tok.written) {
          check_blocks(kv == 0 ? tok.k : tok.v, dim, stored, where);
          continue;
        }
        for (index_t h = 0; h < c_.heads_kv; ++h)
          for (index_t blk = 0; blk < dim / per; ++blk)
            if (!same_bits_of(stored(h, blk), T{}))
              fail(where() + " head " + std::to_string(h) + " block " + std::to_string(blk) + ": never written, but changed");
      }
    }
  }

  FuzzedDataProvider& in_;
  std::mt19937& rng_;
  KvCache<T> cache_;
  const KvCacheConfig& c_;  // the cache's (head_dim_v filled in)
  Model model_;
  index_t raw_pages_ = 1;
  std::vector<T> raw_k_, raw_v_;      // [raw_pages, page_size, heads_kv, head_dim(_v)]
  std::vector<float> raw_ks_, raw_vs_;  // int8: [raw_pages, heads_kv], from 0
  std::vector<Token> raw_tokens_;     // per slot
  std::pair<float*, float> restore_{nullptr, 0.0f};  // an int8 scale made bad for one call
};

// ---- Config and entry point --------------------------------------------------------------

enum class Storage { fp32, bf16, int8, e4m3, e5m2 };
constexpr const char* storage_names[] = {"float", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"};

/// fp8 scales in one of the config's forms: none, one, per K/V head, per (layer, head).
std::vector<float> fp8_scales(FuzzedDataProvider& in, const KvCacheConfig& c) {
  const index_t counts[] = {0, 1, c.heads_kv, c.num_layers * c.heads_kv};
  std::vector<float> s(static_cast<std::size_t>(counts[in.ConsumeIntegralInRange(0, 3)]));
  for (float& x : s)
    x = in.ConsumeBool() ? std::ldexp(1.0f, in.ConsumeIntegralInRange(-4, 2)) : in.ConsumeFloatingPointInRange(0.05f, 4.0f);
  return s;
}

KvCacheConfig read_config(FuzzedDataProvider& in, Storage type) {
  KvCacheConfig c;
  c.num_layers = in.ConsumeIntegralInRange<index_t>(1, max_layers);
  c.num_pages = in.ConsumeIntegralInRange<index_t>(1, max_pages);
  c.page_size = in.ConsumeIntegralInRange<index_t>(1, max_page_size);
  c.heads_kv = in.ConsumeIntegralInRange<index_t>(1, max_heads_kv);
  c.head_dim = in.ConsumeIntegralInRange<index_t>(1, max_head_dim);
  c.head_dim_v = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<index_t>(1, max_head_dim);
  if (type == Storage::e4m3 || type == Storage::e5m2) {
    c.k_scale = fp8_scales(in, c);
    c.v_scale = fp8_scales(in, c);
  }
  c.layout = in.ConsumeBool() ? PageLayout::token_major : PageLayout::head_major;
  // A quarter of the caches where head_dim_v <= head_dim: MLA's latent (KvCacheConfig::latent).
  c.latent = in.ConsumeIntegralInRange(0, 3) == 0 && c.head_dim_v <= c.head_dim;
  if (c.latent) c.v_scale.clear();  // k_scale scales V too
  return c;
}

/// One bad field (or none): the constructor must reject it, naming it.
bool break_config(FuzzedDataProvider& in, KvCacheConfig& c, Storage type) {
  const bool fp8 = type == Storage::e4m3 || type == Storage::e5m2;
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0: c.num_layers = 0; return true;
    case 1: c.num_pages = -in.ConsumeIntegralInRange<index_t>(0, 2); return true;
    case 2: c.page_size = 0; return true;
    case 3: c.heads_kv = 0; return true;
    case 4: c.head_dim = -1; return true;
    case 5: c.head_dim_v = -1; return true;
    case 6: c.num_pages = index_t{1} << 31; return true;  // block tables hold int32 page ids
    case 7:
      if (!fp8) c.k_scale = {1.0f};  // scales on a cache that has none (or keeps its own)
      else c.v_scale.assign(static_cast<std::size_t>(c.num_layers * c.heads_kv + 1), 1.0f);
      return true;
    case 8:
      if (!fp8) c.v_scale = {2.0f};
      else c.k_scale = {fuzz::nan};
      return true;
    case 9:
      if (!fp8) return false;
      c.v_scale = {in.ConsumeBool() ? 0.0f : -fuzz::inf};
      return true;
    case 10: c.num_layers = index_t{1} << 40; return true;  // more than the address space (issue 27, N5)
    case 11:  // fp8: num_layers x heads_kv overflowed in the scale count's check (N4)
      c.num_layers = fp8 ? index_t{1} << 62 : std::numeric_limits<index_t>::max();
      if (fp8) c.k_scale.assign(static_cast<std::size_t>(c.heads_kv + 1), 1.0f);
      return true;
    default: return false;
  }
}

template <class T>
void run(FuzzedDataProvider& in, std::mt19937& rng, KvCacheConfig config, bool broken) {
  if (broken) {
    try {
      KvCache<T> cache(config);
    } catch (const tileattn::invalid_argument& e) {
      fuzz::require_named("kv_cache_fuzz", e);
      say("bad config rejected (" + e.parameter() + ")");
      return;
    }
    fail("a bad config was accepted");
  }
  Harness<T> harness(in, rng, config);
  harness.run();
}

KV_CACHE_FUZZ_UNCOVERED std::string describe(const KvCacheConfig& c, Storage type) {
  std::string s = std::string(storage_names[static_cast<int>(type)]) + " layers " + std::to_string(c.num_layers) +
                  " pages " + std::to_string(c.num_pages) + " page_size " + std::to_string(c.page_size) +
                  " heads_kv " + std::to_string(c.heads_kv) + " head_dim " + std::to_string(c.head_dim) + " head_dim_v " +
                  (c.head_dim_v == 0 ? std::string("= head_dim") : std::to_string(c.head_dim_v)) + " k_scale";
  for (float x : c.k_scale) s += " " + std::to_string(x);
  s += " v_scale";
  for (float x : c.v_scale) s += " " + std::to_string(x);
  return s + (c.latent ? " latent" : "");
}

// ---- 4-bit caches (the 4-bit tag, file comment) ------------------------------------------

enum class Block4 { q4_0, nvfp4, mxfp4, rotated_q4_0 };
constexpr const char* block4_names[] = {"q4_0", "nvfp4", "mxfp4", "hadamard_rotated<q4_0>"};
constexpr std::uint8_t four_bit_tag[4] = {'k', 'c', '4', 'b'};

/// A 4-bit cache's config: as read_config's, but head_dim and head_dim_v whole blocks (1 to
/// 3 of them; rotated: 1 or 2, powers of two), no scales, never latent.
KvCacheConfig read_block_config(FuzzedDataProvider& in, Block4 type) {
  const index_t values = type == Block4::nvfp4 ? nvfp4_block::values : q4_0_block::values;
  const index_t most = type == Block4::rotated_q4_0 ? 2 : 3;
  KvCacheConfig c;
  c.num_layers = in.ConsumeIntegralInRange<index_t>(1, max_layers);
  c.num_pages = in.ConsumeIntegralInRange<index_t>(1, max_pages);
  c.page_size = in.ConsumeIntegralInRange<index_t>(1, max_page_size);
  c.heads_kv = in.ConsumeIntegralInRange<index_t>(1, max_heads_kv);
  c.head_dim = values * in.ConsumeIntegralInRange<index_t>(1, most);
  c.head_dim_v = in.ConsumeBool() ? 0 : values * in.ConsumeIntegralInRange<index_t>(1, most);
  c.layout = in.ConsumeBool() ? PageLayout::token_major : PageLayout::head_major;
  return c;
}

/// One bad field of a 4-bit config: a head dim not whole blocks (rotated: not a power of
/// two), latent (not for 4-bit caches yet), scales, or one of break_config's.
bool break_block_config(FuzzedDataProvider& in, KvCacheConfig& c, Block4 type) {
  const index_t values = type == Block4::nvfp4 ? nvfp4_block::values : q4_0_block::values;
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: c.head_dim += in.ConsumeIntegralInRange<index_t>(1, values - 1); return true;
    case 1: c.head_dim_v = values * in.ConsumeIntegralInRange<index_t>(1, 2) - in.ConsumeIntegralInRange<index_t>(1, values - 1); return true;
    case 2: c.latent = true; return true;
    case 3:
      if (type == Block4::rotated_q4_0) (in.ConsumeBool() ? c.head_dim : c.head_dim_v) = 3 * values;
      else (in.ConsumeBool() ? c.k_scale : c.v_scale) = {1.0f};
      return true;
    default: return break_config(in, c, Storage::fp32);
  }
}

/// An input after the 4-bit tag: the cache type from the byte after it, the rest decoded
/// by its own provider as every other input is.
void run_four_bit(Block4 type, const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  KvCacheConfig config = read_block_config(in, type);
  const bool broken = in.ConsumeIntegralInRange(0, 15) == 0 && break_block_config(in, config, type);
  say(std::string(block4_names[static_cast<int>(type)]) + " (4-bit tag) " +
      describe(config, Storage::fp32).substr(std::string("float").size()) + (broken ? " (broken)" : ""));
  switch (type) {
    case Block4::q4_0: run<q4_0_block>(in, rng, config, broken); break;
    case Block4::nvfp4: run<nvfp4_block>(in, rng, config, broken); break;
    case Block4::mxfp4: run<mxfp4_block>(in, rng, config, broken); break;
    case Block4::rotated_q4_0: run<hadamard_rotated<q4_0_block>>(in, rng, config, broken); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  verbose = std::getenv("KV_CACHE_FUZZ_VERBOSE") != nullptr;
  if (size >= 5 && std::memcmp(data, four_bit_tag, 4) == 0) {
    run_four_bit(static_cast<Block4>(data[4] % 4), data + 5, size - 5);
    return 0;
  }
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  const auto type = static_cast<Storage>(in.ConsumeIntegralInRange(0, 4));
  KvCacheConfig config = read_config(in, type);
  const bool broken = in.ConsumeIntegralInRange(0, 15) == 0 && break_config(in, config, type);
  say(describe(config, type) + (broken ? " (broken)" : ""));
  switch (type) {
    case Storage::fp32: run<float>(in, rng, config, broken); break;
    case Storage::bf16: run<bf16>(in, rng, config, broken); break;
    case Storage::int8: run<std::int8_t>(in, rng, config, broken); break;
    case Storage::e4m3: run<fp8_e4m3>(in, rng, config, broken); break;
    case Storage::e5m2: run<fp8_e5m2>(in, rng, config, broken); break;
  }
  return 0;
}
