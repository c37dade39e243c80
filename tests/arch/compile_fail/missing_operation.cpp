// A set that lacks one operation the kernels call (row_max: the softmax's running maximum).
#include <tileattn/arch/native.hpp>
namespace tileattn::arch {
struct set_without_row_max : generic_set {
  static void row_max() = delete;
};
static_assert(MicroKernelSet<set_without_row_max>);
}  // namespace tileattn::arch
