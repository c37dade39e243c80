// tileattn/backend/serial.hpp: the serial backend: runs every work item on the calling thread.
#pragma once

#include "tileattn/core/types.hpp"

namespace tileattn::backend {

struct Serial {
  static int worker_count(int /*requested*/) { return 1; }

  /// body(item, worker) for every item in [0, count), in order, as worker 0.
  template <class Body>
  static void parallel_for(index_t count, int /*requested*/, Body&& body) {
    for (index_t item = 0; item < count; ++item) body(item, 0);
  }
};

}  // namespace tileattn::backend
