#!/usr/bin/env python3
"""tessera-launch --config_file: Accelerate's config files (python3 accelerate_config_test.py [Class]).

Run from the repository root (the seed's files name configs/deepspeed/... relative to it, as Accelerate
resolves deepspeed_config_file against the working directory). The expected configs are written out here
from what Accelerate's DeepSpeed plugin builds (seed 002), not computed by the code under test. With
TESSERA_BIN (the `tessera` command) each config the launcher makes is also loaded by the engine's loader.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LAUNCH = os.environ.get("TESSERA_LAUNCH", os.path.join(ROOT, "tools", "tessera-launch"))
SEED = os.path.join(HERE, "accelerate_seed")
CLEARED = ("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL", "TESSERA_LAUNCH_", "TESSERA_ZERO3_INIT")


def launch(args, timeout=60, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    e.update(env or {})
    return subprocess.run([sys.executable, LAUNCH] + args, capture_output=True, text=True, timeout=timeout, env=e,
                          cwd=ROOT)


def dry(config_file, *args):
    """(config dict, origin, [rank variable dicts], stderr) of a dry run."""
    r = launch(["--config_file", config_file, "--dry-run"] + list(args) + ["--", "prog"])
    if r.returncode != 0:
        raise AssertionError(f"dry run failed ({r.returncode}): {r.stderr}")
    config, origin, ranks = None, None, []
    for line in r.stdout.splitlines():
        body = line.split(": ", 1)[1]
        if body.startswith("config ("):
            origin, text = body[len("config ("):].rsplit("): ", 1)
            config = json.loads(text)
        elif body.startswith("RANK="):
            ranks.append(dict(item.split("=", 1) for item in body.split() if "=" in item))
    return config, origin, ranks, r.stderr


def seed(name):
    return os.path.join(SEED, name)


def json_file(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def engine_loads(test, config):
    """The engine's own loader takes the launcher's config (`tessera config check`), when TESSERA_BIN is set."""
    tessera = os.environ.get("TESSERA_BIN")
    if not tessera:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    try:
        r = subprocess.run([tessera, "config", "check", f.name], capture_output=True, text=True, timeout=60)
        test.assertNotIn("error", (r.stdout + r.stderr).lower(), r.stdout + r.stderr)
    finally:
        os.unlink(f.name)


AUTO_BATCH = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}


class Seed(unittest.TestCase):
    """Seed 002's YAML and JSON blocks."""

    def test_plugin_zero2(self):
        config, origin, ranks, err = dry(seed("plugin_zero2.yaml"))
        self.assertEqual(config, {**AUTO_BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                                  "zero_optimization": {"stage": 2}, "fp16": {"enabled": True}})
        self.assertIn("DeepSpeed plugin", origin)
        self.assertEqual([r["RANK"] for r in ranks], ["0", "1"])
        self.assertEqual({r["WORLD_SIZE"] for r in ranks}, {"2"})
        self.assertIn("zero3_init_flag applies only at ZeRO stage 3", err)
        engine_loads(self, config)

    def test_plugin_zero3_offload(self):
        config, _, ranks, err = dry(seed("plugin_zero3_offload.yaml"))
        self.assertEqual(config, {**AUTO_BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                                  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                        "offload_param": {"device": "cpu"},
                                                        "stage3_gather_16bit_weights_on_model_save": True},
                                  "fp16": {"enabled": True}})
        self.assertEqual(len(ranks), 2)
        self.assertEqual(err, "")
        engine_loads(self, config)

    def test_config_files(self):
        for yaml_name, json_name in (("file_zero2.yaml", "accelerate_zero_stage2_config.json"),
                                     ("file_zero3_offload.yaml", "accelerate_zero_stage3_offload_config.json")):
            with self.subTest(yaml_name):
                config, origin, ranks, _ = dry(seed(yaml_name))
                # mixed_precision fp16 agrees with the file's fp16.enabled: the file is the config as it is.
                self.assertEqual(config, json_file(f"configs/deepspeed/{json_name}"))
                self.assertIn(f"configs/deepspeed/{json_name} (deepspeed_config_file of", origin)
                self.assertEqual(len(ranks), 2)
                engine_loads(self, config)

    def test_scenario1_ambiguous_config_is_refused_before_anything_starts(self):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            r = launch(["--config_file", seed("scenario1_ambiguous.yaml"), "--", sys.executable, "-c",
                        f"open({marker!r}, 'w')"])
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertFalse(os.path.exists(marker), "a rank started")
        self.assertIn("When using `deepspeed_config_file`, the following accelerate config variables will be ignored:\n"
                      "['gradient_accumulation_steps', 'gradient_clipping', 'zero_stage', 'offload_optimizer_device', "
                      "'offload_param_device', 'zero3_save_16bit_model', 'mixed_precision'].", r.stderr)
        for key in ("gradient_accumulation_steps", "gradient_clipping", "offload_optimizer_device",
                    "offload_param_device", "zero3_save_16bit_model", "zero_stage"):
            self.assertIn("deepspeed_config." + key, r.stderr)
        self.assertNotIn("deepspeed_config.zero3_init_flag", r.stderr)

    def test_scenario2_config_file_only(self):
        config, _, ranks, _ = dry(seed("scenario2_config_file.yaml"))
        self.assertEqual(config, json_file("configs/deepspeed/accelerate_ds_config_bf16_zero3.json"))
        self.assertEqual([r["RANK"] for r in ranks], ["0", "1", "2", "3"])

    def test_scenario3_auto_precision_filled(self):
        config, _, _, _ = dry(seed("scenario3_auto.yaml"))
        expected = json_file("configs/deepspeed/accelerate_ds_config_all_auto.json")
        expected["bf16"]["enabled"] = False
        expected["fp16"] = {"enabled": True}
        self.assertEqual(config, expected)
        engine_loads(self, config)


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


BASE = "distributed_type: DEEPSPEED\nnum_processes: 2\n"


class Errors(unittest.TestCase):
    """Each bad file ends the launcher before any rank starts, naming the file and the key."""

    def check(self, text, *expected, name="acc.yaml"):
        with tempfile.TemporaryDirectory() as d:
            path = write(d, name, text)
            r = launch(["--config_file", path, "--dry-run", "--", "prog"])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        for e in expected:
            self.assertIn(e, r.stderr)
        return r.stderr

    def test_values(self):
        cases = [
            (BASE + "deepspeed_config:\n  zero_stage: 4\n", "deepspeed_config.zero_stage: expected an integer in 0..3, got 4"),
            (BASE + "deepspeed_config:\n  offload_optimizer_device: gpu\n",
             "deepspeed_config.offload_optimizer_device: expected one of none, cpu, nvme, got 'gpu'"),
            (BASE + "deepspeed_config:\n  offload_param_device: nvme\n  zero_stage: 3\n",
             "offload_param_nvme_path must name the directory"),
            (BASE + "deepspeed_config:\n  gradient_accumulation_steps: 0\n",
             "deepspeed_config.gradient_accumulation_steps: expected an integer >= 1, got 0"),
            (BASE + "deepspeed_config:\n  gradient_clipping: -1\n", "gradient_clipping: expected a number > 0"),
            (BASE + "deepspeed_config:\n  zero3_init_flag: maybe\n", "zero3_init_flag: expected true or false"),
            (BASE + "deepspeed_config:\n  zero_stag: 2\n", "deepspeed_config: unknown keys zero_stag"),
            (BASE + "deepspeed_config:\n  deepspeed_multinode_launcher: torque\n",
             "deepspeed_multinode_launcher: expected one of pdsh, standard, openmpi, mvapich, mpich, slurm, nossh"),
            (BASE + "mixed_precision: fp8\n", "mixed_precision: expected one of no, fp16, bf16, got 'fp8'"),
            ("distributed_type: MULTI_GPU\n", "distributed_type: tessera-launch runs DeepSpeed-style jobs"),
            ("distributed_type: DEEPSPEED\nnum_processes: 3\nnum_machines: 2\n",
             "num_processes 3 (all machines together) is not a multiple of num_machines 2"),
            ("distributed_type: DEEPSPEED\nnum_machines: 2\nmachine_rank: 2\n", "machine_rank: expected an integer in 0..1"),
            (BASE + "main_process_port: 70000\n", "main_process_port: expected an integer in 1..65534"),
            (BASE + "num_procesess: 2\n", "unknown keys num_procesess"),
            (BASE + "deepspeed_config:\n  deepspeed_config_file: missing.json\n",
             "deepspeed_config.deepspeed_config_file missing.json: cannot read it"),
            (BASE + "deepspeed_config:\n  deepspeed_hostfile: /nonexistent/hostfile\n", "deepspeed_hostfile /nonexistent/hostfile: no such file"),
            ("distributed_type: DEEPSPEED\n  bad: [indent\n", "acc.yaml:2: not valid YAML"),
            ("- a list\n", "is a mapping of keys"),
        ]
        for text, expected in cases:
            with self.subTest(expected):
                self.check(text, expected)

    def test_precision_conflict_with_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            ds = write(d, "ds.json", json.dumps({"bf16": {"enabled": True}}))
            self.check(BASE + f"mixed_precision: fp16\ndeepspeed_config:\n  deepspeed_config_file: {ds}\n",
                       "mixed_precision is fp16 but", "enables bf16")
            bad = write(d, "bad.json", "{\n  \"bf16\": {\"enabled\": true,}\n}\n")
            self.check(BASE + f"deepspeed_config:\n  deepspeed_config_file: {bad}\n", "bad.json:2: not valid JSON")

    def test_missing_file(self):
        r = launch(["--config_file", "/nonexistent/acc.yaml", "--", "prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--config_file /nonexistent/acc.yaml: cannot read it", r.stderr)


class Launch(unittest.TestCase):
    """The file's machine keys set the launch where the command line does not."""

    def test_machines(self):
        with tempfile.TemporaryDirectory() as d:
            path = write(d, "acc.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\nnum_machines: 2\n"
                         "machine_rank: 1\nmain_process_ip: 10.1.2.3\nmain_process_port: 31000\n")
            _, _, ranks, _ = dry(path)
            self.assertEqual([r["RANK"] for r in ranks], ["2", "3"])
            self.assertEqual({(r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"], r["MASTER_ADDR"], r["TESSERA_STORE_PORT"])
                              for r in ranks}, {("4", "2", "10.1.2.3", "31000")})
            # The command line wins.
            _, _, ranks, _ = dry(path, "--nproc-per-node", "1", "--master-port", "32000")
            self.assertEqual([(r["RANK"], r["WORLD_SIZE"], r["TESSERA_STORE_PORT"]) for r in ranks], [("0", "1", "32000")])

    def test_hostfile_filter_and_launcher(self):
        with tempfile.TemporaryDirectory() as d:
            hosts = write(d, "hostfile", "node1 slots=2\nnode2 slots=2\nnode3 slots=2\n")
            path = write(d, "acc.yaml", BASE + f"deepspeed_config:\n  deepspeed_hostfile: {hosts}\n"
                         "  deepspeed_exclusion_filter: node2\n  deepspeed_multinode_launcher: openmpi\n")
            r = launch(["--config_file", path, "--dry-run", "--", "prog"])
            self.assertEqual(r.returncode, 0, r.stderr)
            cmd = r.stdout.splitlines()[-1]
            self.assertIn("mpirun -n 4 --host node1:2,node3:2", cmd)
            self.assertIn("-x TESSERA_LAUNCH_CONFIG_JSON", cmd)

    def test_yaml_spellings_gpu_ids_and_dynamo(self):
        with tempfile.TemporaryDirectory() as d:
            # An unquoted `no` is YAML 1.1's false: still Accelerate's "no" precision.
            path = write(d, "acc.yaml", BASE + "mixed_precision: no\ngpu_ids: 2,3\ndynamo_backend: INDUCTOR\n")
            r = launch(["--config_file", path, "--", sys.executable, "-c",
                        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sorted(r.stdout.split()), ["2,3", "2,3", "[rank0]:", "[rank1]:"])
            self.assertIn("dynamo_backend INDUCTOR: tessera does not compile the model; not used", r.stderr)
            config, _, _, _ = dry(path)
            self.assertNotIn("fp16", config)
            self.assertNotIn("bf16", config)

    def test_moe_layer_classes_become_leaf_modules(self):
        with tempfile.TemporaryDirectory() as d:
            path = write(d, "acc.yaml", BASE + "deepspeed_config:\n  zero_stage: 3\n"
                         "  deepspeed_moe_layer_cls_names: MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock\n")
            config, _, _, _ = dry(path)
            self.assertEqual(config["zero_optimization"]["leaf_module"],
                             {"classes": ["MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock"]})
            engine_loads(self, config)
            # With a DeepSpeed file, the classes join those the file names.
            ds = write(d, "ds.json", json.dumps({"zero_optimization": {"stage": 3, "leaf_module": {"classes": ["A"]}}}))
            path = write(d, "file.yaml", BASE + f"deepspeed_config:\n  deepspeed_config_file: {ds}\n"
                         "  deepspeed_moe_layer_cls_names: B,A\n")
            config, _, _, _ = dry(path)
            self.assertEqual(config["zero_optimization"]["leaf_module"], {"classes": ["A", "B"]})

    def test_the_ranks_get_the_config(self):
        r = launch(["--config_file", seed("plugin_zero3_offload.yaml"), "--", sys.executable, "-c",
                    "import os; print(os.environ['TESSERA_LAUNCH_CONFIG_JSON'], os.environ['TESSERA_ZERO3_INIT'], "
                    "os.environ['TESSERA_LAUNCH_DS_FIELDS'])"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(r.stdout.splitlines())
        self.assertEqual(len(lines), 2)
        for line in lines:
            text, flag, fields = line.split(": ", 1)[1].rsplit(" ", 2)
            self.assertEqual(json.loads(text)["zero_optimization"]["stage"], 3)
            self.assertEqual(flag, "1")
            self.assertEqual(sorted(fields.split(",")), sorted(
                ["gradient_accumulation_steps", "gradient_clipping", "offload_optimizer_device",
                 "offload_param_device", "zero3_save_16bit_model", "zero_stage"]))


if __name__ == "__main__":
    argv = sys.argv[:1] + sys.argv[1:]
    unittest.main(argv=argv, verbosity=1)
