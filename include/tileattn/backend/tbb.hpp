// tileattn/backend/tbb.hpp: the oneTBB backend (compiled in when TILEATTN_HAS_TBB is defined;
// the CMake target defines it and links TBB::tbb when TILEATTN_WITH_TBB is ON).
#pragma once

#if defined(TILEATTN_HAS_TBB)
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include "tileattn/core/types.hpp"

namespace tileattn::backend {

struct Tbb {
  static int worker_count(int requested) {
    return requested > 0 ? requested : oneapi::tbb::info::default_concurrency();
  }

  /// body(item, worker) for every item, inside a task arena of the requested size;
  /// worker is the thread's slot in that arena. Exceptions propagate to the caller.
  template <class Body>
  static void parallel_for(index_t count, int requested, Body&& body) {
    oneapi::tbb::task_arena arena(worker_count(requested));
    arena.execute([&] {
      oneapi::tbb::parallel_for(
          oneapi::tbb::blocked_range<index_t>(0, count, 1),
          [&](const oneapi::tbb::blocked_range<index_t>& range) {
            const int worker = oneapi::tbb::this_task_arena::current_thread_index();
            for (index_t item = range.begin(); item != range.end(); ++item) body(item, worker);
          },
          oneapi::tbb::simple_partitioner{});
    });
  }
};

}  // namespace tileattn::backend
#endif
