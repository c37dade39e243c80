// An IO policy without written(): the stores could not report what they wrote.
#include "common.hpp"
using namespace kernels_case;
struct ReadOnlyIo {
  static constexpr bool enabled = false;
  void read(std::uint64_t) {}
};
void call() { kernels::run_forward<ReadOnlyIo>(forward_params, tile_plan, execution); }
