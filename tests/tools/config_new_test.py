#!/usr/bin/env python3
"""`tessera config new` as a process, its answers piped in (python3 config_new_test.py TESSERA).

Each answer set's file is compared with the DeepSpeed config written out here by hand for those answers
(what Accelerate's plugin builds), after `tessera config convert --to json` reads it back; TOML and JSON
are both written; bad answers, missing answers and an existing file are refused without writing.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TESSERA = sys.argv.pop(1) if len(sys.argv) > 1 else os.environ["TESSERA_BIN"]
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}


def new(path, answers=None, *flags):
    text = None if answers is None else "".join(a + "\n" for a in answers)
    return subprocess.run([TESSERA, "config", "new", path] + list(flags), input=text, capture_output=True, text=True,
                          timeout=60)


def as_json(path):
    r = subprocess.run([TESSERA, "config", "convert", path, "--to", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class ConfigNew(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_zero3_offload_bf16_json(self):
        # machines, processes, stage, optimizer offload, its path, param offload, 16-bit save, accumulation,
        # clipping, precision
        p = self.path("ds.json")
        r = new(p, ["1", "8", "3", "nvme", "/mnt/nvme0", "cpu", "yes", "4", "0.5", "bf16"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("launch it with: tessera-launch --nproc-per-node 8 PROGRAM --config " + p, r.stdout)
        self.assertNotIn("not yet supported", r.stdout)  # parameter offload to host memory is supported
        with open(p) as f:
            written = json.load(f)
        self.assertEqual(written, {**AUTO, "gradient_accumulation_steps": 4, "gradient_clipping": 0.5,
                                   "bf16": {"enabled": True},
                                   # overlap_comm: DeepSpeed's stage-3 default, which the writer spells out
                                   "zero_optimization": {"stage": 3, "overlap_comm": True,
                                                         "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/nvme0"},
                                                         "offload_param": {"device": "cpu"},
                                                         "stage3_gather_16bit_weights_on_model_save": True}})
        self.assertFalse(os.path.exists(p + ".tmp"))

    def test_zero2_toml_two_machines(self):
        p = self.path("zero2.toml")
        r = new(p, ["2", "10.0.0.1", "29700", "4", "2", "cpu", "1", "0", "no"])
        self.assertEqual(r.returncode, 0, r.stderr)
        launch = ("tessera-launch --nproc-per-node 4 --nnodes 2 --node-rank <this machine, 0..1> --master-addr "
                  "10.0.0.1 --master-port 29700 PROGRAM --config " + p)
        self.assertIn(launch, r.stdout)
        with open(p) as f:
            text = f.read()
        self.assertTrue(text.startswith("# Written by `tessera config new`. Launch: " + launch + "\n"), text[:300])
        self.assertEqual(as_json(p), {**AUTO, "gradient_accumulation_steps": 1,
                                      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})

    def test_defaults(self):
        p = self.path("d.json")
        r = new(p, None, "--defaults")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(as_json(p), {**AUTO, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                                      "zero_optimization": {"stage": 2}})
        # Empty answers take each default too.
        q = self.path("e.json")
        self.assertEqual(new(q, [""] * 7).returncode, 0)
        self.assertEqual(as_json(q), as_json(p))

    def test_refusals_write_nothing(self):
        p = self.path("bad.json")
        cases = [(["1", "1", "4"], "Which ZeRO stage?"), (["1", "1", "2", "gpu"], "expected one of none cpu nvme"),
                 (["1", "1", "2", "none", "0"], "expected an integer in 1..1048576"),
                 (["1", "1", "2", "none", "1", "-1"], "expected a number >= 0"),
                 (["1", "1", "2"], "no answer to \"Where should the optimizer states live")]
        for answers, message in cases:
            with self.subTest(message):
                r = new(p, answers)
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn(message, r.stderr)
                self.assertFalse(os.path.exists(p))
                self.assertFalse(os.path.exists(p + ".tmp"))
        with open(p, "w") as f:
            f.write("{}")
        r = new(p, None, "--defaults")
        self.assertEqual(r.returncode, 1)
        self.assertIn("exists (--force replaces it)", r.stderr)
        self.assertEqual(new(p, None, "--defaults", "--force").returncode, 0)
        self.assertEqual(as_json(p)["zero_optimization"], {"stage": 2})


if __name__ == "__main__":
    unittest.main(verbosity=1)
