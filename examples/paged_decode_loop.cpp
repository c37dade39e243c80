// examples/paged_decode_loop.cpp: the decode loop of an inference server, on a toy two-layer
// model whose attention reads a tileattn::KvCache through tileattn::forward_paged.
//
//   prefill    3 prompts (5, 23 and 40 tokens) in one forward_paged_varlen call per layer
//   decode     one token per live sequence per step, one forward_paged call per layer for the
//              whole batch, with one PagedPlan per step shared by both layers
//   fork       at step 8 sequence 1 forks (a beam): parent and child share every page, and the
//              next extend copies their shared, partly filled last page (copy-on-write)
//   speculate  at step 11 sequence 0 alone feeds 3 tokens (its own plus 2 drafts) and verifies
//              them in one forward_paged call with seqlen_q = 3 (causal, bottom-right aligned);
//              cache.truncate drops the rejected drafts and the page they alone used
//   free       every sequence, then no page may be left in use
//
// The model (fixed random weights, nothing trained): x_0 = embedding[token] + position code,
// per layer q, k, v = x_l Wq, x_l Wk, x_l Wv (8 query heads and 2 K/V heads of 32: GQA) and
// x_(l+1) = x_l + attention output (the residual stream), next token = argmax of x_2 Whead.
// Layer 1's K/V depend on layer 0's attention, so each layer must write its K/V into the cache
// before it attends: extend once, then write layer by layer (cache.append, which takes every
// layer's K/V at once, fits only K/V known in advance).
//
// Self-check: the example keeps its own contiguous copy of every sequence's K/V per layer
// (copied on fork, cut on truncate, as the cache is) and compares each attention call with a
// naive double-precision attention over it; main() returns 1 if an error reaches 1e-4 or a page
// leaks.
//
//   cmake --build build -j2 --target paged_decode_loop && ./build/examples/paged_decode_loop
#include <tileattn/kv_cache.hpp>
#include <tileattn/paged.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <vector>

namespace {

constexpr int num_layers = 2, heads_q = 8, heads_kv = 2, head_dim = 32;
constexpr int group = heads_q / heads_kv;        // query heads per K/V head
constexpr int d_model = heads_q * head_dim;      // 256: the residual stream is one token's Q row
constexpr int kv_width = heads_kv * head_dim;    // 64: one token's K (or V) row
constexpr int vocab = 64;
constexpr int page_size = 16, num_pages = 64;
constexpr int decode_steps = 24, fork_step = 8, speculate_step = 11;  // seq 0: 15 tokens, drafts cross a page
constexpr double tolerance = 1e-4;

/// A small deterministic generator (splitmix64), the same on every platform.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f * 2 - 1; }  // [-1, 1)
};

/// The toy model: seeded random matrices, row-major [in, out].
struct Model {
  std::vector<float> embedding, head;  // [vocab, d_model], [d_model, vocab]
  std::array<std::vector<float>, num_layers> wq, wk, wv;  // [d_model, d_model | kv_width]

  explicit Model(Rng& rng) {
    const auto random = [&](int rows, int cols) {  // uniform, variance 1 / rows
      std::vector<float> w(static_cast<std::size_t>(rows) * cols);
      for (float& e : w) e = rng.uniform() * std::sqrt(3.0f / static_cast<float>(rows));
      return w;
    };
    embedding = random(vocab, d_model);
    for (float& e : embedding) e *= std::sqrt(static_cast<float>(vocab));  // entries of variance 1
    head = random(d_model, vocab);
    for (int l = 0; l < num_layers; ++l)
      wq[l] = random(d_model, d_model), wk[l] = random(d_model, kv_width), wv[l] = random(d_model, kv_width);
  }

  /// x_0 of a token: its embedding plus a sinusoidal position code.
  void embed(int token, int position, float* x) const {
    for (int c = 0; c < d_model; ++c) {
      const double angle = position * std::pow(10000.0, -(c / 2 * 2) / double(d_model));
      x[c] = embedding[token * d_model + c] + static_cast<float>(c % 2 ? std::cos(angle) : std::sin(angle));
    }
  }

  /// y[out] = x[d_model] w[d_model, out].
  static void linear(const float* x, const std::vector<float>& w, float* y, int out) {
    std::fill(y, y + out, 0.0f);
    for (int i = 0; i < d_model; ++i)
      for (int j = 0; j < out; ++j) y[j] += x[i] * w[i * out + j];
  }
  void project(int layer, const float* x, float* q, float* k, float* v) const {
    linear(x, wq[layer], q, d_model), linear(x, wk[layer], k, kv_width), linear(x, wv[layer], v, kv_width);
  }

  /// The rank-th most likely next token (0: greedy) after final hidden state x.
  int pick(const float* x, int rank = 0) const {
    std::vector<float> logits(vocab);
    linear(x, head, logits.data(), vocab);
    std::vector<int> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    return order[rank];
  }
};

/// A live sequence: its id in the cache, its tokens, and the example's own copy of its K/V.
struct Sequence {
  tileattn::SequenceId id = -1;
  std::vector<int> tokens;  // in the cache
  int next = 0;             // the token the next step feeds
  std::vector<float> last;  // final hidden state [d_model] that chose `next`
  std::array<std::vector<float>, num_layers> k, v;  // contiguous [length, heads_kv, head_dim]
};

/// max |o - naive attention| over one sequence's n newest query rows q, o [n, heads_q,
/// head_dim]: row i sees keys [0, length - n + i] (causal, bottom-right aligned).
double naive_error(const std::vector<float>& k, const std::vector<float>& v, const float* q, const float* o,
                   int n) {
  const int length = static_cast<int>(k.size()) / kv_width;
  const double scale = 1 / std::sqrt(double(head_dim));
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < heads_q; ++h) {
      const float* qi = q + (i * heads_q + h) * head_dim;
      const int kh = h / group, keys = length - n + i + 1;
      std::vector<double> p(keys);
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int c = 0; c < head_dim; ++c) dot += qi[c] * double(k[(j * heads_kv + kh) * head_dim + c]);
        p[j] = dot * scale;
      }
      const double m = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double& e : p) sum += (e = std::exp(e - m));
      for (int c = 0; c < head_dim; ++c) {
        double acc = 0;
        for (int j = 0; j < keys; ++j) acc += p[j] * v[(j * heads_kv + kh) * head_dim + c];
        worst = std::max(worst, std::abs(acc / sum - o[(i * heads_q + h) * head_dim + c]));
      }
    }
  return worst;
}

/// New tokens for one sequence (seqs[seq]).
struct Feed {
  int seq;
  std::vector<int> tokens;
};

/// Runs the model on the new tokens of several sequences, as a server's forward pass does:
/// reserves their positions in the cache, then per layer projects, writes K/V into the pages,
/// attends over the pages, checks against the naive attention and adds the output to the
/// residual stream. Returns the final hidden rows [total new tokens, d_model], packed in feed
/// order; the largest error goes to max_error.
std::vector<float> run_model(const Model& model, tileattn::KvCache<float>& cache, std::vector<Sequence>& seqs,
                             const std::vector<Feed>& feeds, double& max_error) {
  std::vector<tileattn::SequenceId> ids;
  std::vector<std::int32_t> cu{0};  // feed b's rows are [cu[b], cu[b + 1])
  for (const Feed& f : feeds) {
    cache.extend(seqs[f.seq].id, static_cast<int>(f.tokens.size()));  // may copy a shared last page
    ids.push_back(seqs[f.seq].id);
    cu.push_back(cu.back() + static_cast<std::int32_t>(f.tokens.size()));
  }
  const int batch = static_cast<int>(feeds.size()), total = cu.back();
  const auto tables = cache.batch(ids);  // block_table [batch, max_pages], cache_seqlens (new tokens in)

  std::vector<float> x(static_cast<std::size_t>(total) * d_model);  // the residual stream
  for (int b = 0; b < batch; ++b) {
    Sequence& s = seqs[feeds[b].seq];
    for (int i = 0; i < cu[b + 1] - cu[b]; ++i) {
      model.embed(feeds[b].tokens[i], static_cast<int>(s.tokens.size()), &x[(cu[b] + i) * d_model]);
      s.tokens.push_back(feeds[b].tokens[i]);
    }
  }

  std::vector<float> q(x.size()), o(x.size()), k(static_cast<std::size_t>(total) * kv_width), v(k.size());
  tileattn::PagedOptions options;
  options.causal = true;  // bottom-right: new row i of n sees the keys up to position length - n + i
  options.execution.backend = tileattn::Backend::serial;  // < 100 keys: threads cost more than they save

  // Every sequence gets the same number of new tokens (decode, speculative verify): q and o
  // are [batch, n, heads_q, head_dim] over the packed rows, and one plan serves every layer.
  // Otherwise (prefill) the rows stay packed and forward_paged_varlen takes cu_seqlens_q.
  const bool uniform =
      std::all_of(feeds.begin(), feeds.end(), [&](const Feed& f) { return int(f.tokens.size()) == cu[1]; });
  const auto q_bshd = tileattn::make_bshd<const float>(q.data(), batch, cu[1], heads_q, head_dim);
  const auto o_bshd = tileattn::make_bshd(o.data(), batch, cu[1], heads_q, head_dim);
  std::optional<tileattn::PagedPlan> plan;
  if (uniform)
    plan = tileattn::plan_forward_paged(q_bshd, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(),
                                tables.seqlens(), o_bshd, tileattn::LseView{}, options);

  for (int l = 0; l < num_layers; ++l) {
    for (int r = 0; r < total; ++r)
      model.project(l, &x[r * d_model], &q[r * d_model], &k[r * kv_width], &v[r * kv_width]);
    for (int b = 0; b < batch; ++b) {  // this layer's K/V into the positions extend reserved
      Sequence& s = seqs[feeds[b].seq];
      const int n = cu[b + 1] - cu[b], position0 = static_cast<int>(cache.length(s.id)) - n;
      cache.write(l, s.id, position0, tileattn::make_thd<const float>(&k[cu[b] * kv_width], n, heads_kv, head_dim),
                  tileattn::make_thd<const float>(&v[cu[b] * kv_width], n, heads_kv, head_dim));
      s.k[l].insert(s.k[l].end(), &k[cu[b] * kv_width], &k[cu[b + 1] * kv_width]);  // the check's copy
      s.v[l].insert(s.v[l].end(), &v[cu[b] * kv_width], &v[cu[b + 1] * kv_width]);
    }
    if (uniform) {
      tileattn::forward_paged(*plan, q_bshd, cache.k_pages(l), cache.v_pages(l), tables.block_table_view(),
                              tables.seqlens(), o_bshd, tileattn::LseView{}, options);
    } else {
      tileattn::forward_paged_varlen(tileattn::make_thd<const float>(q.data(), total, heads_q, head_dim),
                                     cache.k_pages(l), cache.v_pages(l), tables.block_table_view(),
                                     tables.seqlens(), tileattn::make_thd(o.data(), total, heads_q, head_dim),
                                     tileattn::PackedLseView{}, cu, options);
    }
    for (int b = 0; b < batch; ++b) {
      const Sequence& s = seqs[feeds[b].seq];
      max_error = std::max(max_error, naive_error(s.k[l], s.v[l], &q[cu[b] * d_model], &o[cu[b] * d_model],
                                                  cu[b + 1] - cu[b]));
    }
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];  // x_(l+1) = x_l + attention
  }
  return x;
}

void log_step(const char* what, const tileattn::KvCache<float>& cache, const std::vector<Sequence>& seqs,
              double error, const char* note = "") {
  std::printf("%-9s seqs %zu  lengths [", what, seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) std::printf(i ? " %2d" : "%2d", int(cache.length(seqs[i].id)));
  std::printf("]  pages %2d/%d  max err %.1e%s\n", int(cache.num_pages() - cache.free_pages()),
              int(cache.num_pages()), error, note);
}

}  // namespace

int main() {
  Rng rng{42};
  const Model model(rng);
  tileattn::KvCache<float> cache({.num_layers = num_layers, .num_pages = num_pages, .page_size = page_size,
                                  .heads_kv = heads_kv, .head_dim = head_dim});
  double worst = 0;

  // Prefill: three prompts, one varlen call per layer; each prompt's last row picks its next token.
  std::vector<Sequence> seqs;
  std::vector<Feed> prompts;
  for (int length : {5, 23, 40}) {
    prompts.push_back({static_cast<int>(seqs.size()), std::vector<int>(length)});
    for (int& t : prompts.back().tokens) t = rng.below(vocab);
    seqs.emplace_back().id = cache.create();
  }
  double error = 0;
  const std::vector<float> hidden = run_model(model, cache, seqs, prompts, error);
  for (int row = 0; Sequence& s : seqs) {
    row += static_cast<int>(s.tokens.size());
    s.last.assign(&hidden[(row - 1) * d_model], &hidden[row * d_model]);
    s.next = model.pick(s.last.data());
  }
  log_step("prefill", cache, seqs, error);
  worst = std::max(worst, error);

  for (int step = 1; step <= decode_steps; ++step) {
    char name[16], note[96] = "";
    std::snprintf(name, sizeof name, "step %d", step);
    error = 0;
    if (step == speculate_step) {
      // Sequence 0 feeds its own next token and 2 drafts (a stand-in draft model guesses) in
      // one call; draft j is accepted if the model, at the position before it, predicts it.
      Sequence& s = seqs[0];
      const std::vector<int> fed{s.next, (s.next * 31 + 7) % vocab, (s.next * 17 + 3) % vocab};
      const std::vector<float> out = run_model(model, cache, seqs, {{0, fed}}, error);
      int accepted = 1;  // the sequence's own token always stands
      while (accepted < 3 && model.pick(&out[(accepted - 1) * d_model]) == fed[accepted]) ++accepted;
      const int rejected = 3 - accepted, length = static_cast<int>(cache.length(s.id)) - rejected;
      const int pages_verifying = int(cache.num_pages() - cache.free_pages());
      cache.truncate(s.id, length);  // pages past the new length go back to the pool
      s.tokens.resize(length);
      for (int l = 0; l < num_layers; ++l) s.k[l].resize(length * kv_width), s.v[l].resize(length * kv_width);
      s.last.assign(&out[(accepted - 1) * d_model], &out[accepted * d_model]);
      s.next = model.pick(s.last.data());
      std::snprintf(note, sizeof note, "  (seq 0 verifies 3 tokens: %d pages, keeps %d, truncates %d)",
                    pages_verifying, accepted, rejected);
    } else {
      if (step == fork_step) {
        // Beam search: sequence 1 splits; the child continues with the runner-up token.
        Sequence child = seqs[1];  // tokens, hidden state and the check's K/V copy
        child.id = cache.fork(seqs[1].id);
        child.next = model.pick(child.last.data(), 1);
        seqs.push_back(child);
        std::snprintf(note, sizeof note, "  (fork: seq %zu shares seq 1's %zu pages; copy-on-write of the last)",
                      seqs.size() - 1, cache.pages(child.id).size());
      }
      std::vector<Feed> feeds;
      for (int i = 0; i < static_cast<int>(seqs.size()); ++i) feeds.push_back({i, {seqs[i].next}});
      const std::vector<float> out = run_model(model, cache, seqs, feeds, error);
      for (int i = 0; Sequence& s : seqs) {
        s.last.assign(&out[i * d_model], &out[(i + 1) * d_model]), ++i;
        s.next = model.pick(s.last.data());
      }
    }
    log_step(name, cache, seqs, error, note);
    worst = std::max(worst, error);
  }

  for (const Sequence& s : seqs) cache.free(s.id);
  const bool no_leak = cache.free_pages() == cache.num_pages() && cache.num_sequences() == 0;
  std::printf("freed %zu sequences: %d of %d pages free; max |O - naive| = %.1e over all calls\n", seqs.size(),
              int(cache.free_pages()), int(cache.num_pages()), worst);
  const bool ok = worst < tolerance && no_leak;
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
