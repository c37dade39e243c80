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

  // A rotated 4-bit cache: the rotation is its type; its pages reach forward_paged as they are.
  tileattn::KvCache<tileattn::hadamard_rotated<tileattn::q4_0_block>> rotated({.num_pages = 4, .heads_kv = 1, .head_dim = 64});
  const tileattn::SequenceId r = rotated.create();
  const std::vector<float> k64(64), v64(64);
  rotated.append(r, tileattn::TensorView<const float>{k64.data(), {1, 1, 1, 64}, {64, 64, 64, 1}},
                 tileattn::TensorView<const float>{v64.data(), {1, 1, 1, 64}, {64, 64, 64, 1}});
  const tileattn::SequenceId rotated_ids[] = {r};
  const auto rotated_tables = rotated.batch(rotated_ids);
  std::vector<float> o64(64);
  tileattn::forward_paged(tileattn::TensorView<const float>{k64.data(), {1, 1, 1, 64}, {64, 64, 64, 1}},
                          rotated.k_pages(0), rotated.v_pages(0), rotated_tables.block_table_view(),
                          rotated_tables.seqlens(), tileattn::TensorView<float>{o64.data(), {1, 1, 1, 64}, {64, 64, 64, 1}});
  const std::vector<std::int64_t> slots{0};
  tileattn::write_kv_slots(tileattn::StridedView<const float, 3>{k64.data(), {1, 1, 64}, {64, 64, 1}},
                           tileattn::StridedView<const float, 3>{v64.data(), {1, 1, 64}, {64, 64, 1}},
                           rotated.k_pages(0), rotated.v_pages(0), slots);

  const tileattn::SequenceId ids[] = {s};
  const auto tables = cache.batch(ids);  // views of a named BatchTables and a named cache
  return static_cast<int>(tables.block_table_view().shape[0] + tables.seqlens().size() + cache.pages(s).size() +
                          cache.k_pages(0).shape[0] + int8_cache.k_scales(0).shape[0]);
}
