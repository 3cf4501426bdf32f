// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Python exceptions a pybind11 module's functions raise for c10 errors: the types the ops
// raise through the dispatcher (ValueError, TypeError, RuntimeError), without the C++ backtrace.

#include <Python.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <exception>

namespace mhc_sp {

inline void register_error_translator() {
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

}  // namespace mhc_sp
