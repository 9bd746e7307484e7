"""Training -> rollout weight sync from Python (actors/rollout/weight_sync.h): the training side's WeightSender on an
engine made by tessera.initialize, the rollout side's RolloutEngine (tensor-parallel generation, C++) and
RolloutSink. The weights move over UCX from the engine's flat buffers into the rollout's TP shards, planned from
affine maps, and every byte is hashed at both ends before the new version is published.

    training job (every rank):  engine.sync_weights(model_config="policy/config.json", train_job="train",
                                                    rollout_job="rollout")        # the first call connects
    rollout job (every rank):   rollout = tessera.rollout.RolloutEngine(config_path="policy/config.json")
                                sink = tessera.rollout.RolloutSink(rollout, train_job="train", rollout_job="rollout")
                                sink.receive()                                     # one sync; version + 1
                                out = rollout.generate([[1, 2, 3]], temperature=0, max_new_tokens=8)

The two jobs share one store (the rollout job joins the training job's store server: tools/tessera-launch's
TESSERA_STORE_SERVER and TESSERA_STORE_SECRET). The trained module's parameters must carry the Hugging Face names
and shapes of `model_config` (a Llama/Qwen2/Qwen3 config.json, a dict or a path). Options not given come from the
training config's [tessera.rollout] section (sender) or the defaults (sink); both jobs must agree on them."""
import collections
import json
import os

import torch

from . import _tessera

GenerationResult = collections.namedtuple("GenerationResult", ["tokens", "logprobs", "finish_reasons"])


def _config_json(model_config):
    """(json text, file name for errors) of a config dict, a config.json or a directory holding one."""
    if isinstance(model_config, dict):
        return json.dumps(model_config), "model_config"
    path = os.fspath(model_config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            return f.read(), path
    except OSError as e:
        raise _tessera.ConfigError(f"weight sync: cannot read the model config {path}: {e.strerror}") from None


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class WeightSender:
    """The training side of a sync. Collective over both jobs at construction and at every sync()."""

    def __init__(self, engine, model_config, train_job, rollout_job, session="weights", delta=False, timeout_ms=None,
                 staging_bytes=None, replica_policy=None):
        text, name = _config_json(model_config)
        self._sender = _tessera.WeightSender(engine._engine, text, name, train_job, rollout_job, session, delta,
                                             timeout_ms, staging_bytes, replica_policy)

    def sync(self):
        """Sends, verifies and publishes the current weights; returns the sync's figures (WeightSyncStats' fields)."""
        return self._sender.sync()


class RolloutEngine:
    """A tensor-parallel rollout engine over the whole job (every rank calls every method). Weights from model_dir
    (config.json + safetensors), or from config_path alone and then a sync or load_weights()."""

    def __init__(self, model_dir="", config_path="", dtype=torch.float32, timeout_ms=120000):
        self._rollout = _tessera.RolloutEngine(os.fspath(model_dir), os.fspath(config_path), _dtype_name(dtype),
                                               int(timeout_ms))

    def generate(self, prompts, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16, stop_token_ids=(),
                 ignore_eos=False, seed=0, use_kv_cache=True):
        """prompts: lists of token ids. Returns GenerationResult(tokens, logprobs, finish_reasons) per prompt."""
        return GenerationResult(*self._rollout.generate([list(p) for p in prompts], float(temperature), int(top_k),
                                                        float(top_p), int(max_new_tokens), list(stop_token_ids),
                                                        bool(ignore_eos), int(seed), bool(use_kv_cache)))

    def load_weights(self, model_dir):
        self._rollout.load_weights(os.fspath(model_dir))

    @property
    def weight_version(self):
        return self._rollout.weight_version


class RolloutSink:
    """The rollout side of a sync. mode "in_place" writes the live weights (no generate() during receive());
    "double_buffered" writes a standby copy that the next generate() swaps in (listen() / wait_for_version())."""

    def __init__(self, rollout, train_job, rollout_job, session="weights", mode="in_place", delta=False,
                 timeout_ms=None, staging_bytes=None, replica_policy=None):
        self._sink = _tessera.RolloutSink(rollout._rollout, train_job, rollout_job, session, mode, delta, timeout_ms,
                                          staging_bytes, replica_policy)

    def receive(self):
        """Blocks until the training side syncs (within the timeout); returns the sync's figures."""
        return self._sink.receive()

    def listen(self):
        self._sink.listen()

    def stop(self):
        self._sink.stop()

    def wait_for_version(self, version, timeout_ms=120000):
        return self._sink.wait_for_version(int(version), int(timeout_ms))
