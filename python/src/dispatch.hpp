// python/src/dispatch.hpp: calls a function template with the C++ element type Q's array
// holds (float, bf16 or fp16), or throws invalid_argument naming the parameter.
#pragma once

#include <string>

#include "arrays.hpp"

namespace tileattn::python {

template <class A, class F>
decltype(auto) with_storage_type(const A& a, const std::string& name, F&& f) {
  switch (element_of(a)) {
    case Element::float32: return f(float{});
    case Element::bfloat16: return f(bf16{});
    case Element::float16: return f(fp16{});
    default:
      throw invalid_argument(name, std::string("must hold float32, bfloat16 or float16, got ") +
                                       element_name(element_of(a)));
  }
}

}  // namespace tileattn::python
