// A K/V source without scales() asked to read 8-bit K/V, whose dequantization scales it
// cannot place.
#include "common.hpp"
using namespace kernels_case;
struct UnscaledKv {
  template <class T, class KV, class View>
  static auto matrix(const tileattn::ForwardParams<T, KV>& p, const View& view, const kernels::QueryBlock& blk) {
    return kernels::ContiguousKv::matrix(p, view, blk);
  }
};
void call() {
  const kernels::ForwardWorkList work(int8_forward_params, tile_plan);
  kernels::run_forward<tileattn::NoIoCounting, UnscaledKv>(int8_forward_params, tile_plan, work, execution);
}
