// tileattn/backend/openmp.hpp: the OpenMP backend (compiled in when the compiler enables OpenMP).
#pragma once

#if defined(_OPENMP)
#define TILEATTN_HAS_OPENMP 1
#include <omp.h>

#include <exception>
#include <mutex>

#include "tileattn/core/types.hpp"

namespace tileattn::backend {

struct OpenMP {
  static int worker_count(int requested) {
    return requested > 0 ? requested : omp_get_max_threads();
  }

  /// body(item, worker) for every item; worker is the OpenMP thread number. Items are
  /// handed out one at a time in index order, so callers that list their longest items
  /// first get a longest-first schedule. The first exception thrown by a body is
  /// rethrown on the calling thread once the region ends.
  template <class Body>
  static void parallel_for(index_t count, int requested, Body&& body) {
    const int workers = worker_count(requested);
    std::exception_ptr first_error;
    std::mutex error_mutex;
#pragma omp parallel num_threads(workers)
    {
      const int worker = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
      for (index_t item = 0; item < count; ++item) {
        try {
          body(item, worker);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!first_error) first_error = std::current_exception();
        }
      }
    }
    if (first_error) std::rethrow_exception(first_error);
  }
};

}  // namespace tileattn::backend
#endif
