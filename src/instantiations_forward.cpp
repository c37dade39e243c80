// src/instantiations_forward.cpp: the forward's common instantiations (float, bf16, fp16;
// fixed and variable length), compiled once into tileattn::instantiations (CMake option
// TILEATTN_BUILD_INSTANTIATIONS) beside the backward's (instantiations_backward.cpp): two
// translation units, so that a parallel build compiles them at once. Translation units that
// link the library see them as extern templates (TILEATTN_EXTERN_TEMPLATES) and do not
// compile the kernels themselves.
#include "tileattn/forward.hpp"

TILEATTN_INSTANTIATE_FORWARD(, float)
TILEATTN_INSTANTIATE_FORWARD(, tileattn::bf16)
TILEATTN_INSTANTIATE_FORWARD(, tileattn::fp16)
