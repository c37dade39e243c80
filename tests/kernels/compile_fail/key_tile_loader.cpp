// A loader without select(): the key loop could not tell which heads see a key tile.
#include "common.hpp"
using namespace kernels_case;
struct NoSelectLoader {
  template <class F>
  void for_each_head(F&&) {}
  template <class Io>
  void load(index_t, index_t, index_t, Io&) {}
  template <class Io, class F>
  void for_each_operand(index_t, index_t, Io&, F&&) {}
};
void call() {
  NoSelectLoader loader;
  tileattn::NoIoCounting io;
  kernels::forward_item(forward_params, tile_plan, kernels::QueryBlock{}, loader, ops::BuiltinScores{}, io);
}
