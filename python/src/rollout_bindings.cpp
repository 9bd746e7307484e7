#include "python/src/rollout_bindings.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/affine/replica_policy.h"
#include "core/error.h"
#include "core/nn/decoder_config.h"
#include "core/nn/generation.h"
#include "python/src/py_engine.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// What a sync reported, by WeightSyncStats' field names.
py::dict stats_dict(const WeightSyncStats& s) {
  py::dict d;
  d["version"] = s.version, d["bytes_sent"] = s.bytes_sent, d["bytes_mapped"] = s.bytes_mapped, d["puts"] = s.puts;
  d["plan_ms"] = s.plan_ms, d["sync_ms"] = s.sync_ms, d["verify_ms"] = s.verify_ms, d["cast_ms"] = s.cast_ms;
  d["cast_mirror_bytes"] = s.cast_mirror_bytes, d["wire_to_useful"] = s.wire_to_useful;
  d["staging_peak_bytes"] = s.staging_peak_bytes, d["pause_ms"] = s.pause_ms, d["delta"] = s.delta;
  d["pack_ms"] = s.pack_ms, d["changed_elements"] = s.changed_elements, d["full_bytes"] = s.full_bytes;
  d["delta_base_bytes"] = s.delta_base_bytes;
  return d;
}

at::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw ConfigError("rollout: dtype '" + name + "' is not one of float32, bfloat16, float16");
}

// The options both sides share. `base`: [tessera.rollout] of a config (the training engine's), or
// the defaults; the keyword arguments given (not None) override it.
WeightSyncOptions sync_options(WeightSyncOptions base, const std::string& train_job, const std::string& rollout_job,
                               const std::string& session, bool delta, std::optional<int64_t> timeout_ms,
                               std::optional<int64_t> staging_bytes, std::optional<std::string> replica_policy) {
  base.train_job = train_job, base.rollout_job = rollout_job, base.session = session, base.delta = delta;
  if (timeout_ms) {
    if (*timeout_ms <= 0) throw ConfigError("weight sync: timeout_ms must be > 0, got " + std::to_string(*timeout_ms));
    base.timeout = std::chrono::milliseconds(*timeout_ms);
  }
  if (staging_bytes) {
    if (*staging_bytes <= 0) throw ConfigError("weight sync: staging_bytes must be > 0, got " + std::to_string(*staging_bytes));
    base.staging_bytes = *staging_bytes;
  }
  if (replica_policy) base.replica_policy = affine::parse_replica_policy(*replica_policy).kind;
  return base;
}

// A sender keeps the engine it reads alive.
struct PySender {
  std::shared_ptr<PyEngine> engine;
  std::unique_ptr<WeightSender> sender;
};

// A sink keeps its rollout engine alive; it is destroyed first.
struct PyRollout {
  std::unique_ptr<RolloutEngine> rollout;
};
struct PySink {
  std::shared_ptr<PyRollout> rollout;
  std::unique_ptr<RolloutSink> sink;
};

}  // namespace

void bind_rollout(py::module_& m) {
  py::class_<PySender>(m, "WeightSender")
      .def(py::init([](std::shared_ptr<PyEngine> engine, const std::string& config_json, const std::string& config_file,
                       const std::string& train_job, const std::string& rollout_job, const std::string& session,
                       bool delta, std::optional<int64_t> timeout_ms, std::optional<int64_t> staging_bytes,
                       std::optional<std::string> replica_policy) {
             const auto config = nn::parse_decoder_config(config_json, config_file);
             auto options = sync_options(weight_sync_options(engine->engine->config()), train_job, rollout_job, session,
                                         delta, timeout_ms, staging_bytes, replica_policy);
             auto out = std::make_unique<PySender>();
             out->engine = engine;
             py::gil_scoped_release release;  // collective over both jobs
             out->sender = std::make_unique<WeightSender>(*engine->engine, config, options);
             return out;
           }),
           py::arg("engine"), py::arg("config_json"), py::arg("config_file"), py::arg("train_job"),
           py::arg("rollout_job"), py::arg("session"), py::arg("delta"), py::arg("timeout_ms"),
           py::arg("staging_bytes"), py::arg("replica_policy"))
      .def("sync", [](PySender& s) {
        WeightSyncStats stats;
        {
          py::gil_scoped_release release;
          stats = s.sender->sync();
        }
        return stats_dict(stats);
      });

  py::class_<PyRollout, std::shared_ptr<PyRollout>>(m, "RolloutEngine")
      .def(py::init([](const std::string& model_dir, const std::string& config_path, const std::string& dtype,
                       int64_t timeout_ms) {
             RolloutOptions options;
             options.model_dir = model_dir, options.config_path = config_path, options.dtype = dtype_named(dtype);
             if (timeout_ms <= 0) throw ConfigError("RolloutEngine: timeout_ms must be > 0");
             options.timeout = std::chrono::milliseconds(timeout_ms);
             auto out = std::make_shared<PyRollout>();
             py::gil_scoped_release release;  // collective over the TP group
             out->rollout = RolloutEngine::create(options);
             return out;
           }),
           py::arg("model_dir"), py::arg("config_path"), py::arg("dtype"), py::arg("timeout_ms"))
      .def("generate",
           [](PyRollout& r, const std::vector<std::vector<int64_t>>& prompts, double temperature, int64_t top_k,
              double top_p, int64_t max_new_tokens, const std::vector<int64_t>& stop_token_ids, bool ignore_eos,
              uint64_t seed, bool use_kv_cache) {
             nn::SamplingParams params;
             params.temperature = temperature, params.top_k = top_k, params.top_p = top_p;
             params.max_new_tokens = max_new_tokens, params.stop_token_ids = stop_token_ids;
             params.ignore_eos = ignore_eos, params.seed = seed;
             nn::GenerationResult result;
             {
               py::gil_scoped_release release;
               result = r.rollout->generate(prompts, params, use_kv_cache);
             }
             return py::make_tuple(result.tokens, result.logprobs, result.finish_reasons);
           })
      .def("load_weights", [](PyRollout& r, const std::string& dir) {
        py::gil_scoped_release release;
        r.rollout->load_weights(dir);
      })
      .def_property_readonly("weight_version", [](PyRollout& r) { return r.rollout->weight_version(); });

  py::class_<PySink>(m, "RolloutSink")
      .def(py::init([](std::shared_ptr<PyRollout> rollout, const std::string& train_job, const std::string& rollout_job,
                       const std::string& session, const std::string& mode, bool delta,
                       std::optional<int64_t> timeout_ms, std::optional<int64_t> staging_bytes,
                       std::optional<std::string> replica_policy) {
             auto options = sync_options({}, train_job, rollout_job, session, delta, timeout_ms, staging_bytes,
                                         replica_policy);
             if (mode == "in_place") options.mode = SinkMode::in_place;
             else if (mode == "double_buffered") options.mode = SinkMode::double_buffered;
             else throw ConfigError("RolloutSink: mode '" + mode + "' is not one of in_place, double_buffered");
             auto out = std::make_unique<PySink>();
             out->rollout = rollout;
             py::gil_scoped_release release;  // collective over both jobs
             out->sink = std::make_unique<RolloutSink>(*rollout->rollout, options);
             return out;
           }),
           py::arg("rollout"), py::arg("train_job"), py::arg("rollout_job"), py::arg("session"), py::arg("mode"),
           py::arg("delta"), py::arg("timeout_ms"), py::arg("staging_bytes"), py::arg("replica_policy"))
      .def("receive", [](PySink& s) {
        WeightSyncStats stats;
        {
          py::gil_scoped_release release;
          stats = s.sink->receive();
        }
        return stats_dict(stats);
      })
      .def("listen", [](PySink& s) { s.sink->listen(); })
      .def("stop", [](PySink& s) {
        py::gil_scoped_release release;
        s.sink->stop();
      })
      .def("wait_for_version", [](PySink& s, uint64_t version, int64_t timeout_ms) {
        WeightSyncStats stats;
        {
          py::gil_scoped_release release;
          stats = s.sink->wait_for_version(version, std::chrono::milliseconds(timeout_ms));
        }
        return stats_dict(stats);
      });
}

}  // namespace tessera::python
