// Must not compile: a rotated cache's pages are not a view of plain blocks, so they cannot
// reach code that would read them unrotated (reinterpret_view is the one, explicit, way).
#include "common.hpp"

int main() {
  tileattn::KvCache<tileattn::hadamard_rotated<tileattn::q4_0_block>> cache(
      {.num_pages = 4, .heads_kv = 1, .head_dim = 64});
  const tileattn::PagePoolView<const tileattn::q4_0_block> k_pages = cache.k_pages(0);
  return static_cast<int>(k_pages.shape[0]);
}
