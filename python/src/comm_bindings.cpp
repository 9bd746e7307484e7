#include "python/src/comm_bindings.h"

#include <torch/python.h>

#include "actors/actor_runtime.h"
#include "core/error.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

transport::ReduceOp reduce_op(const std::string& name) {
  if (name == "sum") return transport::ReduceOp::sum;
  if (name == "avg") return transport::ReduceOp::avg;
  if (name == "max") return transport::ReduceOp::max;
  throw ConfigError("all_reduce: op '" + name + "' is not one of sum, avg, max");
}

// Runs one operation with the GIL released and waits for it (its own timeout applies).
template <typename Issue>
void run(Issue issue) {
  py::gil_scoped_release release;
  issue()->wait();
}

}  // namespace

void bind_comm(py::module_& m) {
  using transport::Communicator;
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("job_ranks", &Communicator::job_ranks)  // its members' launched ranks, by group rank
      // A sub-group (members by index into this one, in group-rank order); collective over the members;
      // None on the others. timeout_ms 0: this communicator's.
      .def("group", [](Communicator& c, const std::vector<int>& ranks, int64_t timeout_ms) {
        if (timeout_ms < 0) throw ConfigError("tessera.comm.new_group: timeout must be > 0");
        std::optional<std::chrono::milliseconds> timeout;
        if (timeout_ms > 0) timeout = std::chrono::milliseconds(timeout_ms);
        py::gil_scoped_release release;
        return c.group(ranks, "", timeout);
      })
      .def("barrier", [](Communicator& c) { run([&] { return c.barrier(); }); })
      // The tensors are flat contiguous views of the caller's (comm.py reshapes); in place.
      .def("all_reduce", [](Communicator& c, at::Tensor t, const std::string& op) {
        transport::ReduceOptions options;
        options.op = reduce_op(op);
        run([&] { return c.all_reduce(t, options); });
      })
      .def("all_gather", [](Communicator& c, at::Tensor input, at::Tensor output) {
        run([&] { return c.all_gather(input, output); });
      })
      .def("broadcast", [](Communicator& c, at::Tensor t, int root) { run([&] { return c.broadcast(t, root); }); });
  // Collective: every launched rank calls it, in the same order as the engines it makes.
  m.def("world_communicator", [](int64_t timeout_ms) {
    if (timeout_ms <= 0) throw ConfigError("tessera.comm: timeout_ms must be > 0");
    const auto env = transport::LaunchEnv::from_env();
    transport::CommunicatorOptions options;
    options.name = actors::next_communicator_name("python_comm");
    options.timeout = std::chrono::milliseconds(timeout_ms);
    py::gil_scoped_release release;
    return Communicator::gloo(actors::job_store(), env.rank, env.world_size, options);
  });
}

}  // namespace tessera::python
