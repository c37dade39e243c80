// src/instantiations_backward.cpp: the backward's common instantiations (float, bf16, fp16;
// fixed and variable length), compiled once into tileattn::instantiations beside the
// forward's (instantiations_forward.cpp, which says how they are used).
#include "tileattn/backward.hpp"

TILEATTN_INSTANTIATE_BACKWARD(, float)
TILEATTN_INSTANTIATE_BACKWARD(, tileattn::bf16)
TILEATTN_INSTANTIATE_BACKWARD(, tileattn::fp16)
