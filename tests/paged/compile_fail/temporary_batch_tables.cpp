// Must not compile: a view of the temporary BatchTables would dangle once the statement ends.
#include "common.hpp"

int main() {
  tileattn::KvCache<float> cache(compile_fail::config());
  const tileattn::SequenceId ids[] = {cache.create()};
  const auto block_table = cache.batch(ids).block_table_view();
  return static_cast<int>(block_table.shape[0]);
}
