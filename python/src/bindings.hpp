// python/src/bindings.hpp: the parts of tileattn._C, each registered by a function of its own
// translation unit (module.cpp calls them; separate units compile in parallel).
#pragma once

#include <nanobind/nanobind.h>

namespace tileattn::python {

void bind_attention(nanobind::module_& m);  // attention.cpp: forward, backward, varlen
void bind_paged(nanobind::module_& m);      // paged.cpp: forward_paged, write_kv_slots, merge_states
void bind_flex(nanobind::module_& m);       // flex.cpp: forward_flex, backward_flex over the mod menu

}  // namespace tileattn::python
