// python/src/module.cpp: the extension module tileattn._C: its exceptions, the Options object,
// the kernel set this process runs, and the calls registered by attention.cpp, paged.cpp and flex.cpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "options.hpp"
#include "tileattn/active_isa.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/version.hpp"

namespace nb = nanobind;

namespace {

/// Raises `type(what)` with the attribute `parameter`: the argument tileattn named.
void raise_with_parameter(PyObject* type, const tileattn::invalid_argument& e) {
  nb::object exc = nb::borrow(type)(e.what());
  exc.attr("parameter") = e.parameter();
  PyErr_SetObject(type, exc.ptr());
}

}  // namespace

NB_MODULE(_C, m) {
  using tileattn::python::Options;
  m.doc() = "tileattn's kernels over arrays seen in place (NumPy, PyTorch, any __dlpack__ object)";

  static nb::object invalid = nb::exception<tileattn::invalid_argument>(m, "InvalidArgument", PyExc_ValueError);
  static nb::object budget = nb::exception<tileattn::budget_error>(m, "BudgetError", invalid.ptr());
  static nb::object pages = nb::exception<tileattn::out_of_pages>(m, "OutOfPages", PyExc_RuntimeError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tileattn::budget_error& e) {
      raise_with_parameter(budget.ptr(), e);
    } catch (const tileattn::invalid_argument& e) {
      raise_with_parameter(invalid.ptr(), e);
    }
  });

  m.def("active_isa", [] { return std::string(tileattn::active_isa()); },
        "The micro-kernel set this process runs (e.g. \"avx512-bf16\"), chosen once at run time.");
  m.attr("isa_dispatched_at_run_time") = tileattn::isa_dispatched_at_run_time;

  nb::class_<Options>(m, "Options", "The options of one call (tileattn's ForwardOptions and more).")
      .def(nb::init<>())
      .def_rw("softmax_scale", &Options::softmax_scale, nb::arg().none())
      .def_rw("causal", &Options::causal)
      .def_rw("top_left", &Options::top_left)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("attention_chunk", &Options::attention_chunk)
      .def_rw("batch_invariant", &Options::batch_invariant)
      .def_rw("softcap", &Options::softcap)
      .def_rw("alibi_slopes", &Options::alibi_slopes, nb::arg().none())
      .def_rw("sinks", &Options::sinks, nb::arg().none())
      .def_rw("bias", &Options::bias, nb::arg().none())
      .def_rw("mask", &Options::mask, nb::arg().none())
      .def_rw("k_scale", &Options::k_scale, nb::arg().none())
      .def_rw("v_scale", &Options::v_scale, nb::arg().none())
      .def_rw("dsinks", &Options::dsinks, nb::arg().none())
      .def_rw("dbias", &Options::dbias, nb::arg().none())
      .def_rw("num_threads", &Options::num_threads)
      .def_rw("sram_budget_bytes", &Options::sram_budget_bytes)
      .def_rw("num_splits", &Options::num_splits)
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("dropout_seed", &Options::dropout_seed)
      .def_rw("dropout_offset", &Options::dropout_offset);

  tileattn::python::bind_attention(m);
  tileattn::python::bind_paged(m);
  tileattn::python::bind_flex(m);
}
