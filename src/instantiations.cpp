// src/instantiations.cpp: the forward's and backward's common instantiations (float, bf16,
// fp16; fixed and variable length), compiled once into tileattn::instantiations (CMake option
// TILEATTN_BUILD_INSTANTIATIONS). Translation units that link it see them as extern
// templates (TILEATTN_EXTERN_TEMPLATES) and do not compile the kernels themselves.
#include "tileattn/backward.hpp"
#include "tileattn/forward.hpp"

TILEATTN_INSTANTIATE_FORWARD(, float)
TILEATTN_INSTANTIATE_FORWARD(, tileattn::bf16)
TILEATTN_INSTANTIATE_FORWARD(, tileattn::fp16)
TILEATTN_INSTANTIATE_BACKWARD(, float)
TILEATTN_INSTANTIATE_BACKWARD(, tileattn::bf16)
TILEATTN_INSTANTIATE_BACKWARD(, tileattn::fp16)
