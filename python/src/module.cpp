// _tessera: the C++ engine for Python (python/tessera/ is the package users import). Tensors cross
// without copies (LibTorch's own type casters: a torch.Tensor is an at::Tensor). tessera's errors
// become Python exceptions of the same family (tessera.ConfigError, tessera.CheckpointError, ...)
// carrying the C++ message; the calls that run autograd or collectives release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/version.h>

#include <execinfo.h>
#include <unistd.h>

#include <exception>
#include <map>
#include <optional>

#include "actors/engine/engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/config/launch_config.h"
#include "core/config/load.h"
#include "core/affine/serialize.h"
#include "core/error.h"
#include "core/zero/leaf_modules.h"
#include "core/zero/partitioned_construction.h"
#include "core/zero/unit_hooks.h"
#include "python/src/client_optimizer.h"
#include "python/src/comm_bindings.h"
#include "python/src/module_tree.h"
#include "python/src/py_engine.h"
#include "python/src/rollout_bindings.h"
#include "python/src/store_bindings.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// One forward of a ZeRO-3 unit, from its Python module's pre-hook to its post-hook (zero::UnitCall).
struct PyUnitCall {
  std::unique_ptr<zero::UnitCall> call;
};

// A context manager over an Engine::Scope (no_sync, forward, gathered parameters).
class PyScope {
 public:
  explicit PyScope(std::function<Engine::Scope()> open) : open_(std::move(open)) {}
  void enter() {
    py::gil_scoped_release release;  // a scope may be collective (gathered parameters)
    scope_.emplace(open_());
  }
  void exit() {
    py::gil_scoped_release release;
    if (scope_) scope_->close();
    scope_.reset();
  }

 private:
  std::function<Engine::Scope()> open_;
  std::optional<Engine::Scope> scope_;
};

std::shared_ptr<PyEngine> initialize_engine(const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                     const std::string& config_text, bool config_is_path,
                                     const std::vector<std::vector<std::string>>& group_names,
                                     const std::vector<std::map<std::string, double>>& group_options,
                                     const std::vector<std::string>& leaf_modules,
                                     std::optional<ClientKind> client_kind,
                                     const std::vector<std::pair<std::vector<std::string>, std::map<std::string, double>>>& client_groups,
                                     py::object client_step,
                                     std::shared_ptr<transport::Communicator> world) {
  // A config of the script's own beside tessera-launch --config_file's: the Accelerate file's variables
  // fill its "auto" values and must agree with the rest (core/config/launch_config.h).
  auto config = config_is_path ? config::load_config(config_text)
                               : config::load_config_text(config_text, config::Format::json, "the config dict");
  if (const auto launched = config::launch_config_from_env())
    config = config::reconcile_with_launch(std::move(config), *launched);
  InitializeOptions options;
  options.world = std::move(world);  // a tessera.comm process group's (mpu=), else the launch environment's
  for (size_t g = 0; g < group_names.size(); ++g) {
    ParamGroup group;
    group.names = group_names[g];
    for (const auto& [key, value] : group_options[g]) {
      if (key == "lr") group.lr = value;
      else if (key == "weight_decay") group.weight_decay = value;
      else if (key == "eps") group.eps = value;
      else if (key == "beta1") group.beta1 = value;
      else if (key == "beta2") group.beta2 = value;
      else if (key == "momentum") group.momentum = value;
      else throw ConfigError("initialize: model_parameters group " + std::to_string(g) + ": unknown option '" + key + "'");
    }
    options.param_groups.push_back(std::move(group));
  }
  // Deleted without the GIL: the engine's destructor waits for its actors, whose teardown may take
  // it (tensors Python shares, a client Python optimizer); Engine::Impl::stop_actors says why.
  auto out = std::shared_ptr<PyEngine>(new PyEngine, [](PyEngine* engine) {
    if (!PyGILState_Check()) return delete engine;
    py::gil_scoped_release release;
    delete engine;
  });
  out->tree = module_tree(parameters);
  set_z3_leaf_modules_by_name(*out->tree, leaf_modules);  // marked in Python (tessera.utils), by name
  if (client_kind) {
    std::vector<ClientGroup> groups;
    for (const auto& [names, settings] : client_groups) groups.push_back({names, settings});
    options.optimizer = client_optimizer(*client_kind, groups, *out->tree, std::move(client_step));
  }
  py::gil_scoped_release release;  // initialize is collective
  out->engine = tessera::initialize(out->tree, config, options).engine;
  for (const auto& item : out->tree->named_modules()) out->modules[item.key()] = item.value().get();
  return out;
}

// Prints where std::terminate was called from, then hands over to the handler that was there (the
// runtime's, which names the exception): a C++ abort under Python otherwise leaves no trace.
std::terminate_handler previous_terminate = nullptr;
void terminate_with_backtrace() {
  static const char header[] = "tessera: std::terminate called; native backtrace:\n";
  (void)!write(STDERR_FILENO, header, sizeof(header) - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  if (previous_terminate) previous_terminate();
  std::abort();
}

void register_errors(py::module_& m) {
  // Base classes first: pybind11 tries the most recently registered translator first.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<ConfigError> config_error(m, "ConfigError", error.ptr());
  static py::exception<MapError> map_error(m, "MapError", error.ptr());
  static py::exception<TransportError> transport_error(m, "TransportError", error.ptr());
  static py::exception<TimeoutError> timeout_error(m, "TimeoutError", transport_error.ptr());
  static py::exception<PeerLostError> peer_lost_error(m, "PeerLostError", transport_error.ptr());
  static py::exception<CheckpointError> checkpoint_error(m, "CheckpointError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CheckpointError& e) {
      checkpoint_error(e.what());
    } catch (const PeerLostError& e) {
      peer_lost_error(e.what());
    } catch (const TimeoutError& e) {
      timeout_error(e.what());
    } catch (const TransportError& e) {
      transport_error(e.what());
    } catch (const MapError& e) {
      map_error(e.what());
    } catch (const ConfigError& e) {
      config_error(e.what());
    } catch (const Error& e) {
      error(e.what());
    }
  });
}

std::map<std::string, int64_t> moved_dict(const OffloadedStates& m) {
  return {{"parameters", m.parameters}, {"gradients", m.gradients}, {"master_weights", m.master_weights},
          {"optimizer_states", m.optimizer_states}};
}

}  // namespace
}  // namespace tessera::python

PYBIND11_MODULE(_tessera, m) {
  using namespace tessera;
  using namespace tessera::python;
  m.doc() = "tessera's C++ engine (import the tessera package, not this module)";
  m.attr("torch_version") = TORCH_VERSION;  // the LibTorch this module was built against
  register_errors(m);
  previous_terminate = std::set_terminate(terminate_with_backtrace);
  bind_rollout(m);
  bind_store(m);
  bind_comm(m);

  py::enum_<ClientKind>(m, "ClientKind")
      .value("Adam", ClientKind::Adam)
      .value("AdamW", ClientKind::AdamW)
      .value("SGD", ClientKind::SGD)
      .value("Adagrad", ClientKind::Adagrad)
      .value("PythonStep", ClientKind::PythonStep);

  py::class_<PyScope>(m, "Scope")
      .def("__enter__", [](PyScope& s) { s.enter(); })
      .def("__exit__", [](PyScope& s, py::object, py::object, py::object) { s.exit(); });

  py::class_<PyUnitCall>(m, "UnitCall")
      .def("finish", [](PyUnitCall& c, const std::vector<at::Tensor>& outputs, bool unknown_outputs) {
        if (c.call) c.call->finish(outputs, unknown_outputs);
        c.call.reset();
      });

  py::class_<PyEngine, std::shared_ptr<PyEngine>>(m, "Engine")
      // ZeRO-3: the prefixes of the tree's modules that are units, and one forward of one.
      .def("unit_prefixes", [](PyEngine& e) {
        std::vector<std::string> out;
        for (const auto& [prefix, module] : e.modules)
          if (zero::is_unit(module)) out.push_back(prefix);
        return out;
      })
      .def("unit_begin", [](PyEngine& e, const std::string& prefix) {
        const auto* module = e.modules.at(prefix);
        auto call = std::make_unique<PyUnitCall>();
        py::gil_scoped_release release;  // waits for the gather
        call->call = std::make_unique<zero::UnitCall>(module);
        return call;
      })
      .def("gathered_parameters", [](std::shared_ptr<PyEngine> e, const std::vector<std::string>& names, int modifier_rank) {
        return PyScope([e, names, modifier_rank] { return e->engine->gathered_parameters(names, modifier_rank); });
      })
      .def("backward", [](PyEngine& e, const at::Tensor& loss) {
        py::gil_scoped_release release;
        e.engine->backward(loss);
      })
      .def("step", [](PyEngine& e) {
        py::gil_scoped_release release;
        e.engine->step();
      })
      .def("zero_grad", [](PyEngine& e) { e.engine->zero_grad(); })
      .def("forward_scope", [](std::shared_ptr<PyEngine> e) { return PyScope([e] { return e->engine->forward_scope(); }); })
      .def("no_sync", [](std::shared_ptr<PyEngine> e) { return PyScope([e] { return e->engine->no_sync(); }); })
      .def("coalesce_grad_reduction",
           [](std::shared_ptr<PyEngine> e) { return PyScope([e] { return e->engine->coalesce_grad_reduction(); }); })
      .def("scale", [](PyEngine& e, const at::Tensor& loss) { return e.engine->scale(loss); })
      // (maps: [(kind, buffer, the map as JSON)], buffers: {key: this rank's flat buffer}).
      .def("storage_maps", [](PyEngine& e) {
        const auto storage = e.engine->storage_maps();
        std::vector<std::tuple<std::string, std::string, std::string>> maps;
        for (const auto& m : storage.maps) maps.emplace_back(m.kind, m.buffer, affine::map_to_json(m.map));
        return std::make_pair(maps, storage.buffers);
      })
      // offload_states/reload_states: kinds by tessera's names; returns {kind: bytes moved}.
      .def("offload_states", [](PyEngine& e, const std::vector<std::string>& include, bool pin_memory) {
        OffloadStatesOptions options;
        options.pin_memory = pin_memory;
        for (const auto& name : include) {
          bool found = false;
          for (auto k : kAllOffloadStates)
            if (name == name_of(k)) options.include.push_back(k), found = true;
          if (!found) throw ConfigError("offload_states: unknown state '" + name + "'");
        }
        py::gil_scoped_release release;
        return moved_dict(e.engine->offload_states(options));
      })
      .def("reload_states", [](PyEngine& e) {
        py::gil_scoped_release release;
        return moved_dict(e.engine->reload_states());
      })
      .def("states_offloaded", [](PyEngine& e) { return e.engine->states_offloaded(); })
      .def("is_gradient_accumulation_boundary", [](PyEngine& e) { return e.engine->is_gradient_accumulation_boundary(); })
      .def("get_lr", [](PyEngine& e) { return e.engine->get_lrs(); })
      .def("get_last_lr", [](PyEngine& e) { return e.engine->last_lrs(); })
      .def("set_lr", [](PyEngine& e, double lr, std::optional<size_t> group) { e.engine->set_lr(lr, group); })
      .def("has_scheduler", [](PyEngine& e) { return e.engine->has_scheduler(); })
      .def("last_batch_iteration", [](PyEngine& e) { return e.engine->last_batch_iteration(); })
      .def("num_param_groups", [](PyEngine& e) { return e.engine->num_param_groups(); })
      .def("get_global_grad_norm", [](PyEngine& e) { return e.engine->last_grad_norm(); })
      .def_property_readonly("global_steps", [](PyEngine& e) { return e.engine->global_steps(); })
      .def_property_readonly("skipped_steps", [](PyEngine& e) { return e.engine->skipped_steps(); })
      .def("loss_scale", [](PyEngine& e) { return e.engine->loss_scale(); })
      .def("train_micro_batch_size_per_gpu", [](PyEngine& e) { return e.engine->config().train_micro_batch_size_per_gpu.value; })
      .def("gradient_accumulation_steps", [](PyEngine& e) { return e.engine->config().gradient_accumulation_steps.value; })
      .def("zero_optimization_stage", [](PyEngine& e) { return e.engine->config().zero_optimization.stage.value; })
      .def("train", [](PyEngine& e) { e.engine->train(); })
      .def("eval", [](PyEngine& e) { e.engine->eval(); })
      .def_property_readonly("rank", [](PyEngine& e) { return e.engine->rank(); })
      .def_property_readonly("world_size", [](PyEngine& e) { return e.engine->world_size(); })
      .def("save_checkpoint",
           [](PyEngine& e, const std::string& dir, const std::string& tag, const std::string& client_state, bool save_latest) {
             CheckpointSaveOptions options;
             options.tag = tag, options.client_state = client_state, options.save_latest = save_latest;
             py::gil_scoped_release release;
             return e.engine->save_checkpoint(dir, options);
           })
      .def("load_checkpoint",
           [](PyEngine& e, const std::string& dir, const std::string& tag, bool optimizer_states, bool scheduler_states,
              bool module_only) {
             CheckpointLoadOptions options;
             options.tag = tag, options.load_optimizer_states = optimizer_states;
             options.load_lr_scheduler_states = scheduler_states, options.load_module_only = module_only;
             py::gil_scoped_release release;
             const auto loaded = e.engine->load_checkpoint(dir, options);
             return std::make_pair(loaded.path, loaded.client_state);
           })
      .def("save_16bit_model",
           [](PyEngine& e, const std::string& dir, bool exclude_frozen, int64_t max_shard_bytes) {
             Save16BitOptions options;
             options.exclude_frozen_parameters = exclude_frozen, options.max_shard_bytes = max_shard_bytes;
             py::gil_scoped_release release;
             return e.engine->save_16bit_model(dir, options).files;
           })
      // For receivers that are not tessera's: (name, torch dtype, full shape) of every trainable
      // weight, from the storage maps (nothing materialised), and the groups a whole-model walk
      // gathers together (python/tessera/_engine.py's named_weights()).
      .def("weight_metadata", [](PyEngine& e) {
        py::list out;
        for (const auto& w : weight_metadata(*e.engine))
          out.append(py::make_tuple(w.name, py::reinterpret_borrow<py::object>(
                                                reinterpret_cast<PyObject*>(torch::getTHPDtype(w.dtype))),
                                    py::tuple(py::cast(w.shape))));
        return out;
      })
      .def("gather_groups", [](PyEngine& e) { return e.engine->gather_groups(); })
      .def("empty_partition_cache", [](PyEngine& e) {
        py::gil_scoped_release release;
        e.engine->empty_partition_cache();
      })
      .def("wait_for_checkpoint", [](PyEngine& e) {
        py::gil_scoped_release release;
        e.engine->wait_for_checkpoint();
      });

  m.def("initialize", &initialize_engine, py::arg("parameters"), py::arg("config"), py::arg("config_is_path"),
        py::arg("group_names"), py::arg("group_options"), py::arg("leaf_modules") = std::vector<std::string>{},
        py::arg("client_kind") = std::nullopt, py::arg("client_groups") = py::list(), py::arg("client_step") = py::none(),
        py::arg("world") = std::shared_ptr<transport::Communicator>());
  // The config's zero_optimization.leaf_module.classes, matched by initialize against the Python
  // module's class names (the C++ tree it builds has no classes of its own).
  m.def("config_leaf_classes", [](const std::string& text, bool is_path) {
    const auto config = is_path ? config::load_config(text)
                                : config::load_config_text(text, config::Format::json, "the config dict");
    return config.zero_optimization.leaf_module.classes;
  });
  // The launcher's config (tessera-launch --config_file) as (JSON text, origin), None without one.
  m.def("launch_config", []() -> std::optional<std::pair<std::string, std::string>> {
    const auto launched = config::launch_config_from_env();
    if (!launched) return std::nullopt;
    return std::make_pair(launched->json, launched->origin);
  });
  // zero3_init_flag of the launcher's Accelerate file.
  m.def("launch_zero3_init", [] {
    const auto launched = config::launch_config_from_env();
    return launched && launched->zero3_init;
  });
  // tessera.zero.Init: cuts a parameter at construction (rank's chunk kept, the whole freed).
  m.def("partition_parameter", &zero::partition_parameter, py::arg("parameter"), py::arg("world"), py::arg("rank"));
  m.def("is_partitioned", [](const at::Tensor& p) { return zero::constructed_chunk(p).has_value(); });
  m.def("default_z3_leaf_classes", &default_z3_leaf_classes);
  m.def("z3_class_matches", &z3_class_matches, py::arg("pattern"), py::arg("class_name"));
  m.def("z3_suffix_matches", &z3_suffix_matches, py::arg("suffix"), py::arg("name"));
  m.def("launch_rank", [] { return transport::LaunchEnv::from_env().rank; });
  m.def("launch_world_size", [] { return transport::LaunchEnv::from_env().world_size; });
  m.attr("default_max_shard_bytes") = checkpoint::kDefaultMaxShardBytes;
}
