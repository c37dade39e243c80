// tileattn/backend/execution.hpp: how a call asks to be run (which backend, how many threads):
// Backend and Execution (core/execution.hpp, below the params that hold them) and the
// backends' names.
#pragma once

#include "tileattn/core/execution.hpp"

namespace tileattn {

inline const char* to_string(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::serial: return "serial";
    case Backend::openmp: return "openmp";
    case Backend::tbb: return "tbb";
  }
  return "unknown";
}

}  // namespace tileattn
