// tileattn/backend/execution.hpp: how a call asks to be run (which backend, how many threads).
#pragma once

namespace tileattn {

/// The parallel backends. `automatic` picks OpenMP when compiled in, else oneTBB, else
/// serial. Asking for a backend that was not compiled in is an invalid_argument.
enum class Backend { automatic, serial, openmp, tbb };

inline const char* to_string(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::serial: return "serial";
    case Backend::openmp: return "openmp";
    case Backend::tbb: return "tbb";
  }
  return "unknown";
}

/// Per-call execution choice. num_threads == 0 means the backend's default (all hardware
/// threads); at most max_threads. A call never starts more threads than it has work items.
/// Results are bitwise identical for every choice.
struct Execution {
  Backend backend = Backend::automatic;
  int num_threads = 0;
};

}  // namespace tileattn
