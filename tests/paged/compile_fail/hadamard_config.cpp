// Must not compile: a cache is rotated by its type, KvCache<hadamard_rotated<B>>, not by a
// flag in its config that forward_paged's options had to repeat (issue #42).
#include "common.hpp"

int main() {
  tileattn::KvCacheConfig config{.num_pages = 4, .heads_kv = 1, .head_dim = 64};
  config.hadamard = true;
  tileattn::KvCache<tileattn::q4_0_block> cache(config);
  return static_cast<int>(cache.num_pages());
}
