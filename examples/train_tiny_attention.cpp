// examples/train_tiny_attention.cpp: a tiny model trained end to end, with tileattn::forward
// and tileattn::backward as its attention. One causal self-attention layer learns to copy a
// random sequence, in plain C++20 and well under a second.
//
//   input    a0 a1 ... a7 SEP a0 a1 ... a6      (16 tokens, the a's drawn from 8 symbols)
//   target                 a0  a1 a2 ... a7      (the loss is taken at SEP and after it)
//
// Position 8 + j must output a_j, the token exactly 8 places back. Its own input is a_(j-1),
// which does not help, so without attention the best loss is ln 8 = 2.08 (12.5% accuracy).
// Attention that learns "look 8 places back" from the position embeddings solves it.
//
// The model, with every other matmul a plain loop and its backward written out by hand:
//   x      = tok_emb[token] + pos_emb[position]                    [rows, 64]
//   Q,K,V  = x Wq, x Wk, x Wv    (4 heads of head_dim 16)          [rows, 64] each
//   O, LSE = tileattn::forward(Q, K, V, causal)                    [rows, 64], [B, H, S]
//   h      = x + O Wo            (residual)                        [rows, 64]
//   logits = h Whead + b,  loss = mean cross-entropy over the target positions
// and d(loss)/d(O) goes through tileattn::backward (from O and the saved LSE) to dQ, dK, dV.
// Training is SGD with momentum on fixed seeds, so a build prints the same numbers every run.
//
// At start-up, before training, the program checks the whole model's gradient against
// central finite differences of the loss along a random direction in each parameter
// tensor. Wq and Wk only get gradient through tileattn's dQ and dK, Wv through dV, so a
// wrong attention gradient fails this check and main() returns 1 without training (dQ,
// dK or dV scaled by 1.05, zeroed, or with two heads swapped: each fails it).
// main() also returns 1 unless training works: the final loss on held-out sequences must be
// below half the initial one and more than 90% of the copied tokens must be right.
//
// Build and run, from the repository root:
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build -j2 --target train_tiny_attention
//   ./build/examples/train_tiny_attention
//   ctest --test-dir build -R train_tiny --output-on-failure
#include <tileattn/backward.hpp>
#include <tileattn/forward.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <vector>

namespace {

// The task.
constexpr int n_symbols = 8;                 // data tokens 0..7
constexpr int sep = n_symbols;               // the separator token
constexpr int vocab = n_symbols + 1;
constexpr int n_copy = 8;                    // tokens to copy
constexpr int seqlen = 2 * n_copy;
constexpr int batch = 16;                    // sequences per step
constexpr int rows = batch * seqlen;         // one row per token
constexpr int targets_per_batch = batch * n_copy;

// The model.
constexpr int heads = 4, head_dim = 16, d_model = heads * head_dim;

// Training.
constexpr int steps = 300;
constexpr float learning_rate = 0.02f, momentum = 0.9f;  // 0.1 diverges for some seeds
constexpr int print_every = 20;

/// A small deterministic generator (splitmix64), the same on every platform and compiler.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
};

/// `batch` copy sequences; target -1 marks the positions that take no loss.
struct Batch {
  std::vector<int> tokens = std::vector<int>(rows);
  std::vector<int> targets = std::vector<int>(rows, -1);
};

Batch make_batch(Rng& rng) {
  Batch b;
  for (int s = 0; s < batch; ++s) {
    int* t = &b.tokens[s * seqlen];
    for (int j = 0; j < n_copy; ++j) t[j] = rng.below(n_symbols);
    t[n_copy] = sep;
    for (int j = 0; j + 1 < n_copy; ++j) t[n_copy + 1 + j] = t[j];  // teacher forcing
    for (int j = 0; j < n_copy; ++j) b.targets[s * seqlen + n_copy + j] = t[j];
  }
  return b;
}

/// One parameter tensor, its gradient and its momentum buffer.
struct Param {
  const char* name;
  std::vector<float> w, grad, velocity;
  Param(const char* n, int size, float init_std, Rng& rng) : name(n), w(size), grad(size), velocity(size) {
    for (float& x : w) x = init_std * rng.normal();
  }
};

struct Model {
  Param tok, pos, wq, wk, wv, wo, head, head_bias;
  explicit Model(Rng& rng)
      : tok("tok_emb", vocab * d_model, 1.0f, rng),
        pos("pos_emb", seqlen * d_model, 1.0f, rng),
        wq("Wq", d_model * d_model, 1.0f / std::sqrt(float(d_model)), rng),
        wk("Wk", d_model * d_model, 1.0f / std::sqrt(float(d_model)), rng),
        wv("Wv", d_model * d_model, 1.0f / std::sqrt(float(d_model)), rng),
        wo("Wo", d_model * d_model, 1.0f / std::sqrt(float(d_model)), rng),
        head("Whead", d_model * vocab, 1.0f / std::sqrt(float(d_model)), rng),
        head_bias("b_head", vocab, 0.0f, rng) {}
  std::vector<Param*> params() { return {&tok, &pos, &wq, &wk, &wv, &wo, &head, &head_bias}; }
};

/// What the forward keeps for the backward. Q, K, V and O are [batch, seqlen, heads,
/// head_dim] row-major: row r of a [rows, d_model] matrix is token r's 4 heads side by side.
struct Activations {
  std::vector<float> x = std::vector<float>(rows * d_model);
  std::vector<float> q = x, k = x, v = x, o = x, h = x;
  std::vector<float> lse = std::vector<float>(batch * heads * seqlen);
  std::vector<float> probs = std::vector<float>(rows * vocab);
};

tileattn::TensorView<float> bshd(std::vector<float>& t) {
  return tileattn::make_bshd(t.data(), batch, seqlen, heads, head_dim);
}

tileattn::ForwardOptions attention_options() {
  tileattn::ForwardOptions options;
  options.causal = true;  // softmax scale: the default 1 / sqrt(head_dim)
  // 16 tokens per sequence is far too little work to share out: threads cost more than they
  // save (the default, all cores, made this program 10x slower on a busy 2-core machine).
  // The results are bitwise the same for any backend.
  options.execution.backend = tileattn::Backend::serial;
  return options;
}

/// y[n, out] = x[n, in] w[in, out].
void linear(const float* x, const float* w, float* y, int n, int in, int out) {
  for (int r = 0; r < n; ++r) {
    float* yr = y + r * out;
    std::fill(yr, yr + out, 0.0f);
    for (int i = 0; i < in; ++i) {
      const float xi = x[r * in + i];
      for (int j = 0; j < out; ++j) yr[j] += xi * w[i * out + j];
    }
  }
}

/// The backward of linear(): dx += dy w^T and dw += x^T dy.
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, int n, int in,
                     int out) {
  std::vector<float> wt(static_cast<std::size_t>(in) * out);  // w^T, so both loops run along rows
  for (int i = 0; i < in; ++i)
    for (int j = 0; j < out; ++j) wt[j * in + i] = w[i * out + j];
  for (int r = 0; r < n; ++r) {
    const float* dyr = dy + r * out;
    float* dxr = dx + r * in;
    for (int j = 0; j < out; ++j)
      for (int i = 0; i < in; ++i) dxr[i] += dyr[j] * wt[j * in + i];
    for (int i = 0; i < in; ++i) {
      const float xi = x[r * in + i];
      for (int j = 0; j < out; ++j) dw[i * out + j] += xi * dyr[j];
    }
  }
}

struct Result {
  double loss;   // mean cross-entropy over the target positions
  int correct;   // target positions whose most likely token is the target
};

Result forward(const Model& m, const Batch& b, Activations& a) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d_model; ++c)
      a.x[r * d_model + c] = m.tok.w[b.tokens[r] * d_model + c] + m.pos.w[(r % seqlen) * d_model + c];
  linear(a.x.data(), m.wq.w.data(), a.q.data(), rows, d_model, d_model);
  linear(a.x.data(), m.wk.w.data(), a.k.data(), rows, d_model, d_model);
  linear(a.x.data(), m.wv.w.data(), a.v.data(), rows, d_model, d_model);

  tileattn::forward(bshd(a.q), bshd(a.k), bshd(a.v), bshd(a.o),
                    tileattn::make_lse(a.lse.data(), batch, heads, seqlen), attention_options());

  linear(a.o.data(), m.wo.w.data(), a.h.data(), rows, d_model, d_model);
  for (int i = 0; i < rows * d_model; ++i) a.h[i] += a.x[i];

  Result res{0.0, 0};
  std::vector<float> logits(vocab);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < vocab; ++j) logits[j] = m.head_bias.w[j];
    for (int i = 0; i < d_model; ++i)
      for (int j = 0; j < vocab; ++j) logits[j] += a.h[r * d_model + i] * m.head.w[i * vocab + j];
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(double(logits[j] - mx));
    for (int j = 0; j < vocab; ++j) a.probs[r * vocab + j] = float(std::exp(double(logits[j] - mx)) / sum);
    if (const int t = b.targets[r]; t >= 0) {
      res.loss -= double(logits[t] - mx) - std::log(sum);
      res.correct += (std::max_element(logits.begin(), logits.end()) - logits.begin()) == t;
    }
  }
  res.loss /= targets_per_batch;
  return res;
}

/// Fills every Param::grad with d(loss)/d(param) for the batch forward() just ran on.
void backward(Model& m, const Batch& b, const Activations& a) {
  for (Param* p : m.params()) std::fill(p->grad.begin(), p->grad.end(), 0.0f);

  // Cross-entropy + softmax: d(loss)/d(logits) = (probs - one_hot(target)) / #targets.
  std::vector<float> dlogits(rows * vocab, 0.0f);
  for (int r = 0; r < rows; ++r) {
    if (b.targets[r] < 0) continue;
    for (int j = 0; j < vocab; ++j)
      dlogits[r * vocab + j] = (a.probs[r * vocab + j] - (j == b.targets[r] ? 1.0f : 0.0f)) / targets_per_batch;
  }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < vocab; ++j) m.head_bias.grad[j] += dlogits[r * vocab + j];
  std::vector<float> dh(rows * d_model, 0.0f);
  linear_backward(a.h.data(), m.head.w.data(), dlogits.data(), dh.data(), m.head.grad.data(), rows, d_model, vocab);

  // h = x + O Wo: the residual hands dh to x unchanged.
  std::vector<float> dx = dh, dout(rows * d_model, 0.0f);
  linear_backward(a.o.data(), m.wo.w.data(), dh.data(), dout.data(), m.wo.grad.data(), rows, d_model, d_model);

  // The attention: dQ, dK, dV from Q, K, V, the forward's O and LSE, and dO.
  std::vector<float> dq(rows * d_model), dk(rows * d_model), dv(rows * d_model);
  const tileattn::BackwardOptions options(attention_options());  // the forward's options
  auto view = [](const std::vector<float>& t) {
    return tileattn::make_bshd(t.data(), batch, seqlen, heads, head_dim);
  };
  tileattn::backward(view(a.q), view(a.k), view(a.v), view(a.o),
                     tileattn::SavedLseView{a.lse.data(), {batch, heads, seqlen}, {heads * seqlen, seqlen, 1}},
                     view(dout), bshd(dq), bshd(dk), bshd(dv), options);

  linear_backward(a.x.data(), m.wq.w.data(), dq.data(), dx.data(), m.wq.grad.data(), rows, d_model, d_model);
  linear_backward(a.x.data(), m.wk.w.data(), dk.data(), dx.data(), m.wk.grad.data(), rows, d_model, d_model);
  linear_backward(a.x.data(), m.wv.w.data(), dv.data(), dx.data(), m.wv.grad.data(), rows, d_model, d_model);

  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d_model; ++c) {
      m.tok.grad[b.tokens[r] * d_model + c] += dx[r * d_model + c];
      m.pos.grad[(r % seqlen) * d_model + c] += dx[r * d_model + c];
    }
}

/// For each parameter tensor W and a random direction U: the analytic derivative
/// sum(grad * U) against (loss(W + eps U) - loss(W - eps U)) / (2 eps).
bool gradient_check(Model& m, Rng& rng) {
  const Batch b = make_batch(rng);
  Activations a;
  forward(m, b, a);
  backward(m, b, a);
  // The forward runs in float: eps = 1e-3 keeps both the rounding noise (~1e-7 / eps) and
  // the truncation error (~eps^2) of the differences near 1e-4.
  constexpr double eps = 1e-3, rel_tolerance = 1e-2, abs_tolerance = 1e-3;
  bool ok = true;
  std::printf("gradient check: d(loss) along a random direction per tensor, analytic vs central differences\n");
  for (Param* p : m.params()) {
    std::vector<float> dir(p->w.size());
    for (float& d : dir) d = rng.normal();
    double analytic = 0;
    for (std::size_t i = 0; i < dir.size(); ++i) analytic += double(p->grad[i]) * dir[i];
    const std::vector<float> saved = p->w;
    double loss[2];
    for (int side = 0; side < 2; ++side) {
      const double step = side == 0 ? eps : -eps;
      for (std::size_t i = 0; i < dir.size(); ++i) p->w[i] = saved[i] + float(step * dir[i]);
      loss[side] = forward(m, b, a).loss;
    }
    p->w = saved;
    const double numeric = (loss[0] - loss[1]) / (2 * eps);
    const double err = std::abs(analytic - numeric);
    const bool pass = err <= rel_tolerance * std::max(std::abs(analytic), std::abs(numeric)) + abs_tolerance;
    ok = ok && pass;
    std::printf("  %-8s analytic %+.6f  numeric %+.6f  |diff| %.1e  %s\n", p->name, analytic, numeric, err,
                pass ? "ok" : "FAIL");
  }
  return ok;
}

void sgd_step(Model& m) {
  for (Param* p : m.params())
    for (std::size_t i = 0; i < p->w.size(); ++i) {
      p->velocity[i] = momentum * p->velocity[i] + p->grad[i];
      p->w[i] -= learning_rate * p->velocity[i];
    }
}

/// Loss and accuracy on the copied tokens of fixed held-out batches.
Result evaluate(const Model& m, const std::vector<Batch>& held_out) {
  Activations a;
  Result total{0.0, 0};
  for (const Batch& b : held_out) {
    const Result r = forward(m, b, a);
    total.loss += r.loss / double(held_out.size());
    total.correct += r.correct;
  }
  return total;
}

}  // namespace

int main() {
  const auto start = std::chrono::steady_clock::now();
  Rng init_rng{1}, data_rng{2}, check_rng{3}, eval_rng{4};
  Model model(init_rng);

  if (!gradient_check(model, check_rng)) {
    std::printf("FAILED: the model's gradient does not match finite differences\n");
    return 1;
  }

  std::vector<Batch> held_out;
  for (int i = 0; i < 8; ++i) held_out.push_back(make_batch(eval_rng));
  const int held_out_targets = int(held_out.size()) * targets_per_batch;
  const Result initial = evaluate(model, held_out);
  std::printf("copy %d tokens of %d symbols, batch %d, %d heads x %d, SGD lr %.2f momentum %.2f\n", n_copy,
              n_symbols, batch, heads, head_dim, double(learning_rate), double(momentum));
  std::printf("held-out before training: loss %.4f, accuracy %.1f%% (chance: loss %.4f, 12.5%%)\n", initial.loss,
              100.0 * initial.correct / held_out_targets, std::log(double(n_symbols)));

  Activations a;
  double running = 0;
  for (int step = 1; step <= steps; ++step) {
    const Batch b = make_batch(data_rng);
    running += forward(model, b, a).loss;
    backward(model, b, a);
    sgd_step(model);
    if (step % print_every == 0) {
      std::printf("step %4d  train loss %.4f (mean of the last %d steps)\n", step, running / print_every,
                  print_every);
      running = 0;
    }
  }

  const Result final_result = evaluate(model, held_out);
  const double accuracy = double(final_result.correct) / held_out_targets;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("held-out after training:  loss %.4f, accuracy %.1f%%  (%.2f s)\n", final_result.loss,
              100.0 * accuracy, seconds);
  const bool learned = final_result.loss < 0.5 * initial.loss && accuracy > 0.9;
  std::printf("%s\n", learned ? "OK: the layer learned to copy" : "FAILED: the loss did not drop enough");
  return learned ? 0 : 1;
}
