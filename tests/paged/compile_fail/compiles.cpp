// The control: the same flags compile correct uses, so the failures beside it fail for their reason.
#include "common.hpp"

int main() {
  tileattn::KvCache<float> cache(compile_fail::config());
  const tileattn::SequenceId s = cache.create();
  cache.extend(s, 2);
  const std::vector<float> k(8), v(8);
  cache.write(0, s, 0, compile_fail::rows(k, 2), compile_fail::rows(v, 2));
  cache.write(0, s, compile_fail::rows(k, 2), compile_fail::rows(v, 2));

  tileattn::KvCache<std::int8_t> int8_cache(compile_fail::config());
  const tileattn::SequenceId t = int8_cache.create();
  int8_cache.extend(t, 2);
  const std::vector<tileattn::bf16> k16(8), v16(8);
  int8_cache.write(0, t, 0, compile_fail::rows(k16, 2), compile_fail::rows(v16, 2));

  const tileattn::SequenceId ids[] = {s};
  const auto tables = cache.batch(ids);  // views of a named BatchTables and a named cache
  return static_cast<int>(tables.block_table_view().shape[0] + tables.seqlens().size() + cache.pages(s).size() +
                          cache.k_pages(0).shape[0] + int8_cache.k_scales(0).shape[0]);
}
