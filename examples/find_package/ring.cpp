// examples/find_package/ring.cpp: ring attention through an installed tileattn::distributed
// (built by the package test when tileattn was configured with TILEATTN_WITH_MPI=ON).
#include <tileattn/distributed/ring.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const tileattn::index_t N = 64, H = 2, D = 16;
  const tileattn::ring::ShardLayout layout(N, ranks);
  const tileattn::index_t n = layout.local_len(rank);
  std::vector<float> q(n * H * D + 1, 0.5f), k(q), v(q), o(q.size());
  tileattn::ForwardOptions opts;
  opts.causal = true;
  tileattn::ring::forward(MPI_COMM_WORLD, layout, tileattn::make_bshd(q.data(), 1, n, H, D),
                               tileattn::make_bshd(k.data(), 1, n, H, D), tileattn::make_bshd(v.data(), 1, n, H, D),
                               tileattn::make_bshd(o.data(), 1, n, H, D), opts);
  if (rank == 0) std::printf("ring attention over %d rank(s): o[0] = %g\n", ranks, o[0]);
  MPI_Finalize();
  return 0;
}
