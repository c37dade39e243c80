// A set whose exp2 returns double: the kernels store its result as a float row correction.
#include <tileattn/arch/native.hpp>
namespace tileattn::arch {
struct set_with_double_exp2 : generic_set {
  static double exp2(float x) { return static_cast<double>(generic::exp2(x)); }
};
static_assert(MicroKernelSet<set_with_double_exp2>);
}  // namespace tileattn::arch
