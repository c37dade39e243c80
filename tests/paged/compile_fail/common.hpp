// tests/paged/compile_fail/common.hpp: a small cache and rows for the compile_fail cases.
#pragma once
#include <tileattn/tileattn.hpp>

#include <vector>

namespace compile_fail {

inline tileattn::KvCacheConfig config() {
  tileattn::KvCacheConfig c;
  c.num_pages = 4;
  c.page_size = 2;
  c.heads_kv = 1;
  c.head_dim = 4;
  return c;
}

/// n rows [n, heads_kv = 1, head_dim = 4] of element type S.
template <class S>
tileattn::StridedView<const S, 3> rows(const std::vector<S>& data, tileattn::index_t n) {
  return {data.data(), {n, 1, 4}, {4, 4, 1}};
}

}  // namespace compile_fail
