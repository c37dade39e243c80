// Must not compile: a view of a temporary cache's pages would dangle once the statement ends.
#include "common.hpp"

int main() {
  const auto k_pages = tileattn::KvCache<float>(compile_fail::config()).k_pages(0);
  return static_cast<int>(k_pages.shape[0]);
}
