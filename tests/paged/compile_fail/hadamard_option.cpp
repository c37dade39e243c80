// Must not compile: forward_paged has no hadamard option any more. Whether Q and O are turned
// by H comes from the pools' element type (hadamard_rotated<B>), so a forward cannot disagree
// with how its cache was written (issue #42: the option could be set, or forgotten, silently).
#include "common.hpp"

int main() {
  tileattn::PagedOptions options;
  options.hadamard = true;
  return static_cast<int>(options.num_splits);
}
