// tileattn/memory/io_counter.hpp: HBM traffic accounting policies for tile loads and stores.
//
// Kernels are templated on the policy. NoIoCounting compiles to nothing; CountingIo adds
// the bytes of every tile load (HBM read) and store (HBM write) made by one worker.
// Workers count privately and the kernel sums them into the caller's IoCounts
// (core/io_counts.hpp) at the end.
#pragma once

#include <cstdint>

#include "tileattn/core/io_counts.hpp"

namespace tileattn {

/// The policy used when nobody asked for counts: zero cost.
struct NoIoCounting {
  static constexpr bool enabled = false;
  void read(std::uint64_t) {}
  void written(std::uint64_t) {}
};

/// Counts one worker's traffic.
struct CountingIo {
  static constexpr bool enabled = true;
  IoCounts counts;
  void read(std::uint64_t bytes) { counts.bytes_read += bytes; }
  void written(std::uint64_t bytes) { counts.bytes_written += bytes; }
};

}  // namespace tileattn
