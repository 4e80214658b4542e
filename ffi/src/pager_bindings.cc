#include "pager_bindings.h"

#include <Python.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace jaxoff::pager {

namespace {

bool PythonAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// A Python callable held by C++ threads: released with the GIL held (never from a thread
// that does not hold it, as a nanobind object would be).
struct PyCallable {
  explicit PyCallable(nb::callable fn) : fn(fn.release().ptr()) {}
  ~PyCallable() {
    if (!PythonAlive()) return;  // leaked at exit: the interpreter is going
    nb::gil_scoped_acquire gil;
    Py_DECREF(fn);
  }
  PyObject* fn;
};

// The pager's commit, on its thread: `commit(version, [(file, offset, crc32c), ...])` in
// Python writes the store's manifest. An exception fails the commit with its message.
aio::GpuPager::CommitFn PythonCommit(nb::callable commit) {
  auto fn = std::make_shared<PyCallable>(std::move(commit));
  return [fn](uint64_t version, const aio::GpuPager::Crcs& crcs) -> aio::IoStatus {
    aio::IoStatus st;
    if (!PythonAlive()) {
      st.err = ESHUTDOWN;
      st.message = "the Python interpreter exited before the step's commit; the store keeps "
                   "its previous version";
      return st;
    }
    nb::gil_scoped_acquire gil;
    try {
      nb::list rows;
      for (const auto& [key, crc] : crcs) rows.append(nb::make_tuple(key.first, key.second, crc));
      nb::handle(fn->fn)(version, rows);
    } catch (nb::python_error& e) {
      // "<ExceptionType>: <message>", as a traceback ends: jaxoff.aio.store_error_from reads
      // the page store's own error back from a step's message.
      st.err = EIO;
      st.message = std::string(nb::str(e.type().attr("__name__")).c_str()) + ": " +
                   nb::str(e.value()).c_str();
    } catch (const std::exception& e) {
      st.err = EIO;
      st.message = e.what();
    }
    return st;
  };
}

nb::tuple StatusTuple(const aio::IoStatus& st) {
  return nb::make_tuple(st.err, st.message);
}

}  // namespace

void BindPager(nb::module_& m, MakeEntry make) {
  m.def(
      "pager_open",
      [make](const std::string& table, int device, uint64_t version,
             const std::vector<CrcRow>& crcs, nb::callable commit, size_t slot_bytes,
             int arena_slots, int ring_slots, int write_slots, int io_threads,
             double wait_limit_s, const std::string& stale_hint) {
        aio::PagerConfig c;
        c.slot_bytes = slot_bytes;
        c.arena_slots = arena_slots;
        c.ring_slots = ring_slots;
        c.write_slots = write_slots;
        c.wait_limit = std::chrono::milliseconds(static_cast<int64_t>(wait_limit_s * 1000));
        auto fn = PythonCommit(std::move(commit));
        nb::gil_scoped_release nogil;
        std::shared_ptr<Entry> entry;
        try {
          entry = make(table, device, io_threads);
        } catch (const std::exception& e) {
          throw std::runtime_error("cannot open the pager of file table '" + table + "': " +
                                   e.what());
        }
        entry->stale_hint = stale_hint;
        return Open(std::move(entry), c, version, crcs, std::move(fn));
      },
      nb::arg("table"), nb::kw_only(), nb::arg("device") = 0, nb::arg("version"),
      nb::arg("crcs"), nb::arg("commit"), nb::arg("slot_bytes"), nb::arg("arena_slots"),
      nb::arg("ring_slots"), nb::arg("write_slots"), nb::arg("io_threads") = 4,
      nb::arg("wait_limit_s") = 600.0, nb::arg("stale_hint") = "",
      "Opens the pager of a registered file table at store `version`, with the checksums of "
      "its chunks ((file, offset, crc32c)); returns the opening's serial number, which the "
      "other pager_* calls take. `commit(version, crcs)` runs on its thread once a "
      "step's writes are durable; `stale_hint` ends the message of a stale state. Replaces a "
      "pager open under that name.");
  m.def(
      "pager_plan",
      [](const std::string& table, uint64_t serial, int64_t plan_id,
         const std::vector<PlanIo>& even_reads, const std::vector<PlanIo>& even_writes,
         const std::vector<PlanIo>& odd_reads, const std::vector<PlanIo>& odd_writes) {
        RegisterPlan(table, serial, plan_id, even_reads, even_writes, odd_reads, odd_writes);
      },
      nb::arg("table"), nb::arg("serial"), nb::arg("plan_id"), nb::arg("even_reads"), nb::arg("even_writes"),
      nb::arg("odd_reads"), nb::arg("odd_writes"),
      "Registers step plan `plan_id`: the reads and writes ((site, file, offset, bytes), in "
      "call order) of a step that reads an even / odd store version.");
  m.def(
      "pager_reset",
      [](const std::string& table, uint64_t serial, uint64_t version,
         const std::vector<CrcRow>& crcs) {
        aio::IoStatus st;
        {
          nb::gil_scoped_release nogil;
          st = Reset(table, serial, version, crcs);
        }
        return StatusTuple(st);
      },
      nb::arg("table"), nb::arg("serial"), nb::arg("version"), nb::arg("crcs"),
      "Sets the pager's store version and checksums anew; (errno, message), (0, '') if done.");
  m.def(
      "pager_settle",
      [](const std::string& table, uint64_t serial) {
        aio::IoStatus st;
        {
          nb::gil_scoped_release nogil;
          st = Settle(table, serial);
        }
        return StatusTuple(st);
      },
      nb::arg("table"), nb::arg("serial") = 0,
      "Waits for the last step's writes and commit; (errno, message) of the first error since "
      "the last call that returned one, (0, '') if none.");
  m.def("pager_checksums", &Checksums, nb::arg("table"), nb::arg("serial") = 0,
        "The checksums the pager holds, as (file, offset, crc32c).");
  m.def(
      "pager_stats",
      [](const std::string& table, uint64_t serial) {
        uint64_t version = 0;
        const aio::PagerStats s = Stats(table, serial, &version);
        nb::dict d;
        d["version"] = version;
        d["steps_begun"] = s.steps_begun;
        d["commits"] = s.commits;
        d["takes"] = s.takes;
        d["puts"] = s.puts;
        d["reads_done"] = s.reads_done;
        d["writes_done"] = s.writes_done;
        d["syncs"] = s.syncs;
        d["version_checks"] = s.version_checks;
        d["stale_steps"] = s.stale_steps;
        d["h2d_bytes"] = s.h2d_bytes;
        d["d2h_bytes"] = s.d2h_bytes;
        d["take_wait_ns"] = s.take_wait_ns;
        d["put_wait_ns"] = s.put_wait_ns;
        d["begin_wait_ns"] = s.begin_wait_ns;
        d["max_reads_in_flight"] = s.max_reads_in_flight;
        d["max_h2d_ahead"] = s.max_h2d_ahead;
        d["read_only_steps"] = s.read_only_steps;
        d["reads_in_flight"] = s.reads_in_flight;
        d["writes_in_flight"] = s.writes_in_flight;
        return d;
      },
      nb::arg("table"), nb::arg("serial") = 0, "The pager's counters and its store version.");
  m.def(
      "pager_close",
      [](const std::string& table, uint64_t serial) {
        nb::gil_scoped_release nogil;  // a pending commit calls into Python
        return Close(table, serial);
      },
      nb::arg("table"), nb::arg("serial") = 0,
      "Closes a pager (its pending commit done, its writes waited for) if it is still the "
      "opening `serial` (0: any); False if that one is not open.");
  m.def("pager_tables", &Tables, "The tables with an open pager.");
  m.def(
      "pager_serial",
      [](const std::string& table) -> uint64_t {
        auto e = Find(table);
        return e == nullptr ? 0 : e->serial;
      },
      nb::arg("table"), "The serial of the pager open under `table` (0: none).");
}

}  // namespace jaxoff::pager
