#include "python/src/store_bindings.h"

#include <pybind11/stl.h>

#include <chrono>

#include "actors/actor_runtime.h"
#include "transport/store.h"

namespace py = pybind11;

namespace tessera::python {

void bind_store(py::module_& m) {
  using transport::Store;
  py::class_<Store, std::shared_ptr<Store>>(m, "Store")
      .def("set", [](Store& s, const std::string& key, const py::bytes& value) { s.set(key, std::string(value)); })
      // Blocks until the key exists (timeout_ms 0: the store's own timeout); TimeoutError names the key.
      .def("get", [](Store& s, const std::string& key, int64_t timeout_ms) {
        std::string value;
        {
          py::gil_scoped_release release;
          value = s.get_string(key, std::chrono::milliseconds(timeout_ms));
        }
        return py::bytes(value);
      }, py::arg("key"), py::arg("timeout_ms") = 0)
      .def("add", [](Store& s, const std::string& key, int64_t delta) { return s.add(key, delta); })
      .def("check", [](Store& s, const std::vector<std::string>& keys) { return s.check(keys); })
      .def("remove", [](Store& s, const std::string& key) { return s.remove(key); })
      .def_property_readonly("prefix", [](Store& s) { return s.prefix(); });
  // The job's store (its own keys) and a namespace shared by every job meeting in it.
  m.def("job_store", [] { return actors::job_store(); });
  m.def("shared_store", [](const std::string& name) { return actors::job_store()->shared(name); });
}

}  // namespace tessera::python
