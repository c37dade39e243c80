// Must not compile: write_kv_slots takes the rotation from the pools' type, not a positional
// bool (issue #42): `true` after the rotary positions no longer names a parameter.
#include "common.hpp"

int main() {
  std::vector<tileattn::q4_0_block> k_pool(4 * 2 * 2), v_pool(k_pool.size());
  const std::vector<float> k(64), v(64);
  const std::vector<std::int64_t> slots{0};
  const tileattn::StridedView<const float, 3> k_rows{k.data(), {1, 1, 64}, {64, 64, 1}}, v_rows{v.data(), {1, 1, 64}, {64, 64, 1}};
  tileattn::write_kv_slots(k_rows, v_rows, tileattn::make_page_pool(k_pool.data(), 4, 2, 1, 2),
                           tileattn::make_page_pool(v_pool.data(), 4, 2, 1, 2), slots, {}, {}, true);
}
