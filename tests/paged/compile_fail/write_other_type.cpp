// Must not compile: a KvCache<float> takes float rows, not bf16 ones.
#include "common.hpp"

int main() {
  tileattn::KvCache<float> cache(compile_fail::config());
  const tileattn::SequenceId s = cache.create();
  cache.extend(s, 2);
  const std::vector<tileattn::bf16> k(8), v(8);
  cache.write(0, s, 0, compile_fail::rows(k, 2), compile_fail::rows(v, 2));
}
