// tileattn/core/execution.hpp: how a call asks to be run (which backend, how many threads):
// the plain types that options and params hold. backend/ runs them (backend/parallel_for.hpp)
// and names them (backend/execution.hpp).
#pragma once

namespace tileattn {

/// The parallel backends. `automatic` picks OpenMP when compiled in, else oneTBB, else
/// serial. Asking for a backend that was not compiled in is an invalid_argument.
enum class Backend { automatic, serial, openmp, tbb };

/// Per-call execution choice. num_threads == 0 means the backend's default (all hardware
/// threads); at most max_threads. A call never starts more threads than it has work items.
/// Results are bitwise identical for every choice.
struct Execution {
  Backend backend = Backend::automatic;
  int num_threads = 0;
};

}  // namespace tileattn
