#include "py_engine.h"

#include <Python.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crc32c.h"
#include "engine.h"
#include "file_table.h"

namespace nb = nanobind;

namespace jaxoff::ffi_handlers {
namespace {

using aio::EngineConfig;

EngineConfig MakeConfig(size_t block_size, int queue_depth, int threads, bool o_direct,
                        size_t pool_bytes, const std::string& backend) {
  EngineConfig c;
  c.block_size = block_size;
  c.queue_depth = queue_depth;
  c.threads = threads;
  c.o_direct = o_direct;
  c.pool_bytes = pool_bytes;
  c.backend = aio::ParseBackend(backend);
  c.Validate();
  return c;
}

[[noreturn]] void RaiseOsError(int err, const std::string& message) {
  PyObject* args = err > 0 ? Py_BuildValue("(is)", err, message.c_str())
                           : Py_BuildValue("(s)", message.c_str());
  PyErr_SetObject(PyExc_OSError, args);
  Py_XDECREF(args);
  throw nb::python_error();
}

using AnyArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
using RoArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// A pending numpy read or write. Holds the array until the I/O finished; dropping a pending
// future waits for it (the engine must never write into freed memory).
class IoFuture {
 public:
  IoFuture(std::shared_ptr<aio::Completion> c, nb::object keep)
      : completion_(std::move(c)), keep_(std::move(keep)) {}
  ~IoFuture() {
    if (completion_ && !completion_->done()) {
      nb::gil_scoped_release release;
      completion_->Wait();
    }
  }
  bool done() const { return completion_->done(); }
  bool wait(std::optional<double> timeout) {
    nb::gil_scoped_release release;
    if (!timeout) {
      completion_->Wait();
      return true;
    }
    return completion_->WaitFor(*timeout);
  }
  void result() {
    wait(std::nullopt);
    const aio::IoStatus& s = completion_->status();
    if (!s.ok()) RaiseOsError(s.err, s.message);
  }

 private:
  std::shared_ptr<aio::Completion> completion_;
  nb::object keep_;
};

class PyEngine {
 public:
  explicit PyEngine(const EngineConfig& c) : engine_(std::make_shared<aio::Engine>(c)) {}

  IoFuture* ReadInto(const std::string& path, uint64_t offset, nb::handle array) {
    AnyArray a = nb::cast<AnyArray>(array);
    auto file = Open(path, /*create=*/false);
    void* dst = a.data();
    const size_t n = a.nbytes();
    std::shared_ptr<aio::Completion> c;
    {
      nb::gil_scoped_release release;
      c = engine_->Read(file, offset, dst, n);
    }
    return new IoFuture(std::move(c), nb::borrow(array));
  }

  IoFuture* Write(const std::string& path, uint64_t offset, nb::handle array) {
    RoArray a = nb::cast<RoArray>(array);
    auto file = Open(path, /*create=*/true);
    const void* src = a.data();
    const size_t n = a.nbytes();
    std::shared_ptr<aio::Completion> c;
    {
      nb::gil_scoped_release release;
      c = engine_->Write(file, offset, src, n);
    }
    return new IoFuture(std::move(c), nb::borrow(array));
  }

  std::string backend() const { return engine_->backend_name(); }
  size_t pool_buffers() const { return engine_->pool_buffers(); }
  bool o_direct() const { return engine_->config().o_direct; }

 private:
  std::shared_ptr<const aio::File> Open(const std::string& path, bool create) {
    return std::make_shared<aio::File>(std::vector<std::string>{path}, /*writable=*/true, create,
                                       engine_->config().o_direct);
  }
  std::shared_ptr<aio::Engine> engine_;
};

uint32_t Crc32cOf(nb::handle data, uint32_t value) {
  RoArray a = nb::cast<RoArray>(data);
  const void* p = a.data();
  const size_t n = a.nbytes();
  nb::gil_scoped_release release;
  return aio::Crc32cExtend(value, p, n);
}

}  // namespace

void BindEngine(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const aio::IoError& e) {
      PyObject* args = e.err() > 0 ? Py_BuildValue("(is)", e.err(), e.what())
                                   : Py_BuildValue("(s)", e.what());
      PyErr_SetObject(PyExc_OSError, args);
      Py_XDECREF(args);
    }
  });

  nb::class_<IoFuture>(m, "IoFuture", "A pending engine read or write.")
      .def("done", &IoFuture::done, "True once the I/O finished (successfully or not).")
      .def("wait", &IoFuture::wait, nb::arg("timeout") = nb::none(),
           "Blocks until done (or `timeout` seconds); returns done().")
      .def("result", &IoFuture::result, "Waits; raises OSError naming path, offset and errno.");

  nb::class_<PyEngine>(m, "Engine", "The async I/O engine (io_uring or POSIX threads).")
      .def("__init__",
           [](PyEngine* self, size_t block_size, int queue_depth, int threads, bool o_direct,
              size_t pool_bytes, const std::string& backend) {
             new (self) PyEngine(
                 MakeConfig(block_size, queue_depth, threads, o_direct, pool_bytes, backend));
           },
           nb::arg("block_size"), nb::arg("queue_depth"), nb::arg("threads"), nb::arg("o_direct"),
           nb::arg("pool_bytes"), nb::arg("backend"))
      .def("read_into", &PyEngine::ReadInto, nb::arg("path"), nb::arg("offset"), nb::arg("array"),
           nb::rv_policy::take_ownership,
           "Reads array.nbytes bytes at `offset` of `path` into the C-contiguous `array`.")
      .def("write", &PyEngine::Write, nb::arg("path"), nb::arg("offset"), nb::arg("array"),
           nb::rv_policy::take_ownership,
           "Writes the bytes of the C-contiguous `array` at `offset` of `path` (created).")
      .def_prop_ro("backend", &PyEngine::backend)
      .def_prop_ro("pool_buffers", &PyEngine::pool_buffers)
      .def_prop_ro("o_direct", &PyEngine::o_direct);

  m.def("crc32c", &Crc32cOf, nb::arg("data"), nb::arg("value") = 0,
        "CRC-32C of a C-contiguous array (or buffer), continuing from `value`.");
  m.def("crc32c_is_hardware", &aio::Crc32cIsHardware);
  m.def("uring_compiled_in", &aio::UringCompiledIn);

  m.def(
      "register_file_table",
      [](const std::string& name, const std::vector<std::vector<std::string>>& files,
         size_t block_size, int queue_depth, int threads, bool o_direct, size_t pool_bytes,
         const std::string& backend, uint64_t stripe_bytes) {
        auto c = MakeConfig(block_size, queue_depth, threads, o_direct, pool_bytes, backend);
        nb::gil_scoped_release release;
        RegisterFileTable(name, files, c, stripe_bytes);
      },
      nb::arg("name"), nb::arg("files"), nb::arg("block_size"), nb::arg("queue_depth"),
      nb::arg("threads"), nb::arg("o_direct"), nb::arg("pool_bytes"), nb::arg("backend"),
      nb::arg("stripe_bytes") = 0,
      "Opens (creating) the files of a table a pager pages through; file_id indexes `files`.");
  m.def("unregister_file_table", &UnregisterFileTable, nb::arg("name"));
  m.def("file_tables", &FileTableNames);
  m.def(
      "file_table_stats",
      [](const std::string& name) -> std::optional<std::map<std::string, uint64_t>> {
        auto t = FindFileTable(name);
        if (!t) return std::nullopt;
        const aio::EngineStats e = t->engine->Stats();
        return std::map<std::string, uint64_t>{
            {"io_busy_ns", e.busy_ns}, {"read_bytes", e.read_bytes}, {"write_bytes", e.write_bytes}};
      },
      nb::arg("name"), "The table's engine: busy time and bytes read and written, or None.");
  m.def("file_table_backend", [](const std::string& name) -> std::optional<std::string> {
    auto t = FindFileTable(name);
    if (!t) return std::nullopt;
    return std::string(t->engine->backend_name());
  });
}

}  // namespace jaxoff::ffi_handlers
