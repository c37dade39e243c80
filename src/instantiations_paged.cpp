// src/instantiations_paged.cpp: the paged forward's common instantiations (paged.hpp,
// TILEATTN_INSTANTIATE_PAGED_COMMON says which and why), compiled once into
// tileattn::instantiations beside the forward's and the backward's (instantiations_forward.cpp
// says how they are used): a third TU, so that a parallel build compiles it with the others.
#include "tileattn/paged.hpp"

TILEATTN_INSTANTIATE_PAGED_COMMON()
