// examples/ring_attention.cpp: ring attention over MPI, forward and backward, in one file.
// Every rank holds a shard of one long sequence; K and V travel around the ring of ranks
// (tileattn/distributed/ring.hpp), and each rank ends with its own rows of O, dQ, dK, dV,
// as if attention had run on the whole sequence in one process. The program checks that.
//
//   mpicxx -std=c++20 -O2 -march=native -fopenmp -Iinclude examples/ring_attention.cpp
//   mpirun -np 4 ./a.out        (as root: mpirun --allow-run-as-root --oversubscribe ...)
//
// Any number of ranks works, 1 included. CMake: link tileattn::distributed
// (-DTILEATTN_WITH_MPI=ON).
#include <mpi.h>

#include <tileattn/distributed/ring.hpp>
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ring = tileattn::ring;
using tileattn::index_t;

// One sequence of N tokens; grouped-query attention: 8 query heads share 2 K/V heads.
constexpr index_t B = 1, N = 1000, H = 8, Hkv = 2, d = 64;

std::vector<float> random_tensor(index_t rows, index_t heads, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(B * rows * heads * d));
  for (float& e : x) e = normal(rng);
  return x;
}

// Views of [B, rows, heads, d] buffers (FlashAttention's layout) and of [B, H, rows] LSEs.
tileattn::TensorView<float> view(std::vector<float>& x, index_t rows, index_t heads) {
  return tileattn::make_bshd(x.data(), B, rows, heads, d);
}
tileattn::TensorView<const float> cview(std::vector<float>& x, index_t rows, index_t heads) {
  return view(x, rows, heads);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

int main(int argc, char** argv) {
  // The ring's MPI calls come from the calling thread only: FUNNELED is enough.
  int provided = 0, rank = 0, P = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);

  // 1. The full inputs, the same on every rank (a fixed seed). A real program would load
  //    or produce only its own shard; here every rank also needs them for the check.
  std::mt19937 rng(2024);
  auto q = random_tensor(N, H, rng), k = random_tensor(N, Hkv, rng), v = random_tensor(N, Hkv, rng);
  auto dout = random_tensor(N, H, rng);  // d(loss)/dO, as a training step would get it

  // 2. The layout: which rows each rank holds. Zig-zag (the default) gives rank r pieces r
  //    and 2P-1-r of 2P, so that every rank does the same work under the causal mask.
  const ring::ShardLayout layout(N, P, ring::Sharding::zigzag);
  const index_t n = layout.local_len(rank);  // this rank's rows

  // 3. Cut this rank's shard of every input.
  const auto cut = [&](std::vector<float>& full, index_t heads) {
    std::vector<float> mine(static_cast<std::size_t>(B * n * heads * d));
    ring::shard(cview(full, N, heads), view(mine, n, heads), layout, rank);
    return mine;
  };
  auto q_r = cut(q, H), k_r = cut(k, Hkv), v_r = cut(v, Hkv), dout_r = cut(dout, H);

  // 4. The ring forward: this rank's rows of O and their log-sum-exps (the backward needs them).
  tileattn::BackwardOptions options;  // a ForwardOptions too; the backward takes the forward's
  options.causal = true;
  std::vector<float> o_r(q_r.size()), lse_r(static_cast<std::size_t>(B * H * n));
  const auto lse_r_view = tileattn::make_lse(lse_r.data(), B, H, n);
  ring::forward(MPI_COMM_WORLD, layout, cview(q_r, n, H), cview(k_r, n, Hkv), cview(v_r, n, Hkv), view(o_r, n, H),
                     lse_r_view, options);

  // 5. The ring backward: dQ of this rank's queries; dK and dV of this rank's keys, summed
  //    over every rank's queries (they travel around the ring and come home).
  std::vector<float> dq_r(q_r.size()), dk_r(k_r.size()), dv_r(v_r.size());
  ring::backward(MPI_COMM_WORLD, layout, cview(q_r, n, H), cview(k_r, n, Hkv), cview(v_r, n, Hkv),
                      cview(o_r, n, H), tileattn::SavedLseView(lse_r_view), cview(dout_r, n, H), view(dq_r, n, H),
                      view(dk_r, n, Hkv), view(dv_r, n, Hkv), options);

  // 6. The check: single-process forward and backward on the full tensors, cut the same
  //    way, must match this rank's shard (fp32: the sums run in another order, no more).
  std::vector<float> o(q.size()), lse(static_cast<std::size_t>(B * H * N)), dq(q.size()), dk(k.size()), dv(v.size());
  const auto lse_view = tileattn::make_lse(lse.data(), B, H, N);
  tileattn::forward(cview(q, N, H), cview(k, N, Hkv), cview(v, N, Hkv), view(o, N, H), lse_view, options);
  tileattn::backward(cview(q, N, H), cview(k, N, Hkv), cview(v, N, Hkv), cview(o, N, H),
                     tileattn::SavedLseView(lse_view), cview(dout, N, H), view(dq, N, H), view(dk, N, Hkv),
                     view(dv, N, Hkv), options);
  std::vector<float> lse_want(lse_r.size());  // the LSE is [B, H, N]: its rows are dimension 2
  ring::shard(tileattn::SavedLseView(lse_view), tileattn::make_lse(lse_want.data(), B, H, n), layout, rank, 2);
  const double err = std::max({max_abs_diff(o_r, cut(o, H)), max_abs_diff(lse_r, lse_want),
                               max_abs_diff(dq_r, cut(dq, H)), max_abs_diff(dk_r, cut(dk, Hkv)),
                               max_abs_diff(dv_r, cut(dv, Hkv))});
  int pass = err < 1e-4;

  const auto chunks = layout.chunks(rank);
  std::printf("rank %d of %d: rows [%ld, %ld) + [%ld, %ld), max |ring - single process| over O, LSE, dQ, dK, dV = %.2e %s\n",
              rank, P, long(chunks[0].start), long(chunks[0].start + chunks[0].length), long(chunks[1].start),
              long(chunks[1].start + chunks[1].length), err, pass ? "ok" : "FAIL");
  int all_pass = 0;
  MPI_Allreduce(&pass, &all_pass, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%s\n", all_pass ? "PASS" : "FAIL");
  MPI_Finalize();
  return all_pass ? 0 : 1;
}
