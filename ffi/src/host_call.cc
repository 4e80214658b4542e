#include "host_call.h"

#include <Python.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jaxoff::ffi_handlers {
namespace {

// Set once from Python and never released: a handler may run while the interpreter exits.
PyObject* g_dispatch = nullptr;

const char* DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    default: return nullptr;
  }
}

// (memoryview over the buffer, dtype name, shape): what the Python side reads or fills.
nb::object Describe(const ffi::AnyBuffer& b, bool writable) {
  const char* dtype = DtypeName(b.element_type());
  if (dtype == nullptr) return nb::object();
  nb::list shape;
  for (int64_t d : b.dimensions()) shape.append(d);
  PyObject* mv = PyMemoryView_FromMemory(static_cast<char*>(b.untyped_data()),
                                         static_cast<Py_ssize_t>(b.size_bytes()),
                                         writable ? PyBUF_WRITE : PyBUF_READ);
  if (mv == nullptr) throw nb::python_error();
  return nb::make_tuple(nb::steal(mv), nb::str(dtype), nb::tuple(shape));
}

ffi::Error HostCallImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name) {
  if (!Py_IsInitialized()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxoff_host_call: the Python interpreter is not running");
  }
  nb::gil_scoped_acquire gil;
  if (g_dispatch == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxoff_host_call: no dispatch function; import jaxoff.aio first");
  }
  std::string error;
  try {
    nb::list ins, outs;
    for (size_t i = 0; i < args.size(); ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) return b.error();
      nb::object d = Describe(*b, false);
      if (!d.is_valid()) {
        return ffi::Error(ffi::ErrorCode::kUnimplemented,
                          "jaxoff_host_call: operand " + std::to_string(i) +
                              " has a dtype the host call does not pass");
      }
      ins.append(d);
    }
    for (size_t i = 0; i < rets.size(); ++i) {
      auto r = rets.get<ffi::AnyBuffer>(i);
      if (!r.has_value()) return r.error();
      nb::object d = Describe(**r, true);
      if (!d.is_valid()) {
        return ffi::Error(ffi::ErrorCode::kUnimplemented,
                          "jaxoff_host_call: result " + std::to_string(i) +
                              " has a dtype the host call does not fill");
      }
      outs.append(d);
    }
    nb::object out = nb::borrow(g_dispatch)(nb::str(name.data(), name.size()), ins, outs);
    if (out.is_none()) return ffi::Error::Success();
    error = nb::str(out).c_str();
  } catch (nb::python_error& e) {
    error = std::string("jaxoff_host_call ") + std::string(name) + ": " + e.what();
  } catch (std::exception& e) {
    error = std::string("jaxoff_host_call ") + std::string(name) + ": " + e.what();
  }
  return ffi::Error(ffi::ErrorCode::kInternal, error);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostCall, HostCallImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name"));

void BindHostCall(nb::module_& m) {
  m.def(
      "set_host_call_dispatch",
      [](nb::object fn) {
        // A previous function is leaked, not released: it may still be running in a thread.
        g_dispatch = fn.inc_ref().ptr();
      },
      "Sets the Python function every jaxoff_host_call calls: fn(name, operands, results), "
      "each a list of (memoryview, dtype name, shape); it returns None or an error message.");
}

}  // namespace jaxoff::ffi_handlers
