// tileattn/backend/parallel_for.hpp: the one parallel_for contract every kernel uses,
// dispatching an Execution to the serial, OpenMP or oneTBB backend.
//
// Contract: body(item, worker) runs exactly once for each item in [0, count); worker is
// in [0, worker_count(exec, count)) and no two concurrent bodies share a worker number, so a
// kernel can give each worker its own scratch. Kernels write disjoint outputs per item,
// which is why every backend and thread count gives bitwise identical results.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>

#include "tileattn/backend/execution.hpp"
#include "tileattn/backend/openmp.hpp"
#include "tileattn/backend/serial.hpp"
#include "tileattn/backend/tbb.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/limits.hpp"

namespace tileattn {

/// Whether a backend was compiled into this build.
inline bool backend_available(Backend b) {
  switch (b) {
    case Backend::automatic:
    case Backend::serial: return true;
    case Backend::openmp:
#if defined(TILEATTN_HAS_OPENMP)
      return true;
#else
      return false;
#endif
    case Backend::tbb:
#if defined(TILEATTN_HAS_TBB)
      return true;
#else
      return false;
#endif
  }
  return false;
}

/// The concrete backend `automatic` stands for in this build.
inline Backend resolve_backend(Backend b) {
  if (b != Backend::automatic) return b;
  if (backend_available(Backend::openmp)) return Backend::openmp;
  if (backend_available(Backend::tbb)) return Backend::tbb;
  return Backend::serial;
}

namespace detail {

inline void validate_execution(const Execution& exec) {
  TILEATTN_REQUIRE(backend_available(exec.backend), "backend",
          join({"backend '", to_string(exec.backend), "' was not compiled in"}));
  TILEATTN_REQUIRE(exec.num_threads >= 0 && exec.num_threads <= max_threads, "num_threads",
          "must be in [0, " + std::to_string(max_threads) + "] (0 means the backend default), got " +
              std::to_string(exec.num_threads));
}

template <class Visitor>
decltype(auto) visit_backend(Backend b, Visitor&& visit) {
  switch (resolve_backend(b)) {
#if defined(TILEATTN_HAS_OPENMP)
    case Backend::openmp: return visit(backend::OpenMP{});
#endif
#if defined(TILEATTN_HAS_TBB)
    case Backend::tbb: return visit(backend::Tbb{});
#endif
    default: return visit(backend::Serial{});
  }
}

}  // namespace detail

/// The threads `exec` asks for: num_threads, or the backend's default when it is 0.
inline int worker_count(const Execution& exec) {
  return detail::visit_backend(exec.backend,
                               [&](auto be) { return be.worker_count(exec.num_threads); });
}

/// How many distinct worker numbers parallel_for(exec, count, ...) uses: the threads asked
/// for, but never more than there are items.
inline int worker_count(const Execution& exec, index_t count) {
  const int workers = worker_count(exec);
  return count < workers ? static_cast<int>(std::max<index_t>(count, 1)) : workers;
}

template <class Body>
void parallel_for(const Execution& exec, index_t count, Body&& body) {
  if (count <= 0) return;
  const int workers = worker_count(exec, count);
  detail::visit_backend(exec.backend, [&](auto be) { be.parallel_for(count, workers, body); });
}

/// parallel_for whose items start in index order, whatever the backend: each worker takes
/// the next unstarted item from a shared counter and runs it to the end. So a body may wait
/// for an item with a smaller index (the backward's ordered dQ sums): that item has
/// started on a running worker, and the smallest unfinished item waits for nothing. Same
/// contract on `worker` as parallel_for.
template <class Body>
void parallel_for_in_order(const Execution& exec, index_t count, Body&& body) {
  if (count <= 0) return;
  std::atomic<index_t> next{0};
  parallel_for(exec, worker_count(exec, count), [&](index_t, int worker) {
    for (index_t item = next.fetch_add(1); item < count; item = next.fetch_add(1)) body(item, worker);
  });
}

}  // namespace tileattn
