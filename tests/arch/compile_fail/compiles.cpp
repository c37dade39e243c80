// The control: a set built from generic's functions with TILEATTN_DEFINE_MICRO_KERNEL_SET
// satisfies MicroKernelSet, with the same flags, so the failures beside it come from the
// concept, not from the set-up.
#include <tileattn/arch/native.hpp>
namespace tileattn::arch {
TILEATTN_DEFINE_MICRO_KERNEL_SET(control_set, generic);
static_assert(MicroKernelSet<control_set>);
static_assert(MicroKernelSet<native_set>);
}  // namespace tileattn::arch
