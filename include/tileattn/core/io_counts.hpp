// tileattn/core/io_counts.hpp: the HBM bytes one kernel call moved, as options ask for them
// (ForwardOptions::io_counts). The policies that count them are memory/io_counter.hpp's.
#pragma once

#include <cstdint>

namespace tileattn {

/// HBM bytes moved by one kernel call: only bytes of valid tensor elements count,
/// never the zero padding of partial tiles.
struct IoCounts {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;

  IoCounts& operator+=(const IoCounts& other) {
    bytes_read += other.bytes_read;
    bytes_written += other.bytes_written;
    return *this;
  }
  friend bool operator==(const IoCounts&, const IoCounts&) = default;
};

}  // namespace tileattn
