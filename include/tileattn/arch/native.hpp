// tileattn/arch/native.hpp: picks, at compile time, the micro-kernel set for the target
// being compiled for, as tileattn::arch::native.
#pragma once

#include "tileattn/arch/generic.hpp"

namespace tileattn::arch {
namespace native = generic;
}  // namespace tileattn::arch
