"""Accelerate's config file (what `accelerate config` writes) as tessera-launch settings and a DeepSpeed config.

`tessera-launch --config_file accelerate.yaml PROGRAM` reads the file with python3-yaml. Its DeepSpeed
plugin (`deepspeed_config:` zero_stage, offload_*, ...) becomes a DeepSpeed-style config as Accelerate's
DeepSpeedPlugin builds one; with `deepspeed_config_file` that JSON file is the config, its "auto"
precision filled from `mixed_precision`. The ranks get it in the environment (AccelerateLaunch.environment();
the engine's side is core/config/launch_config.h). num_processes (all machines together, as in Accelerate),
num_machines, machine_rank and main_process_* set the launch where the command line does not.
"""
import json
import os
from dataclasses import dataclass, field

from .common import die

# The plugin's variables that a deepspeed_config_file makes meaningless, in Accelerate's order.
IGNORED_WITH_CONFIG_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                            "offload_optimizer_device", "offload_param_device", "zero3_save_16bit_model",
                            "mixed_precision")
NVME_PATHS = ("offload_optimizer_nvme_path", "offload_param_nvme_path")

PLUGIN_KEYS = set(IGNORED_WITH_CONFIG_FILE) | set(NVME_PATHS) | {
    "zero3_init_flag", "deepspeed_moe_layer_cls_names", "deepspeed_hostfile", "deepspeed_inclusion_filter",
    "deepspeed_exclusion_filter", "deepspeed_multinode_launcher", "deepspeed_config_file"}
# Top-level keys of Accelerate's file that decide nothing here (other back ends, tools, TPUs, notes).
INERT_KEYS = {"main_training_function", "use_cpu", "command_file", "commands", "downcast_bf16",
              "megatron_lm_config", "rdzv_backend", "same_network", "tpu_name", "tpu_zone", "tpu_env",
              "tpu_use_cluster", "tpu_use_sudo", "debug", "enable_cpu_affinity", "ipex_config", "mpirun_config",
              "dynamo_config", "tpu_vm"}
# The keys read (compute_environment, fsdp_config and dynamo_backend only to refuse or note what they ask).
LAUNCH_KEYS = {"distributed_type", "deepspeed_config", "mixed_precision", "num_processes", "num_machines",
               "machine_rank", "main_process_ip", "main_process_port", "gpu_ids", "compute_environment",
               "fsdp_config", "dynamo_backend"}
MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "slurm", "nossh")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
PRECISIONS = ("no", "fp16", "bf16")


@dataclass
class AccelerateLaunch:
    """What one Accelerate file says: the config for the ranks and the launch settings."""
    path: str
    deepspeed_config: dict
    origin: str
    # The plugin variables the file gave that a program's own config would leave unused.
    plugin_fields: list = field(default_factory=list)
    zero3_init: bool = False
    num_processes: int = None      # all machines together
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = None
    main_process_port: int = None
    hostfile: str = None
    include: str = ""
    exclude: str = ""
    launcher: str = None
    visible_devices: str = None    # gpu_ids other than "all": CUDA_VISIBLE_DEVICES
    notes: list = field(default_factory=list)

    def environment(self):
        """The variables that carry the config to every rank: its JSON text, where it came from, the plugin
        variables the file gave, and zero3_init_flag."""
        env = {
            "TESSERA_LAUNCH_CONFIG_JSON": json.dumps(self.deepspeed_config, separators=(",", ":")),
            "TESSERA_LAUNCH_CONFIG_ORIGIN": self.origin,
            "TESSERA_LAUNCH_DS_FIELDS": ",".join(self.plugin_fields),
            "TESSERA_ZERO3_INIT": "1" if self.zero3_init else "0",
        }
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env


class _Reader:
    def __init__(self, path, data):
        self.path, self.data = path, data

    def fail(self, key, expected, value):
        die(f"{self.path}: {key}: expected {expected}, got {value!r}")

    def integer(self, table, key, prefix, low, high=None, default=None):
        value = table.get(key, default)
        if value is None:
            return default
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)  # Accelerate's files sometimes quote numbers
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            self.fail(prefix + key, f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}", value)
        return value

    def boolean(self, table, key, prefix, default=False):
        value = table.get(key, default)
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        if not isinstance(value, bool):
            self.fail(prefix + key, "true or false", value)
        return value

    def choice(self, table, key, prefix, choices, default):
        value = table.get(key, default)
        if value is None:
            return default
        text = str(value).lower() if isinstance(value, str) else value
        if text not in choices:
            self.fail(prefix + key, "one of " + ", ".join(choices), value)
        return text

    def text(self, table, key, prefix):
        value = table.get(key)
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        if not isinstance(value, str) or not value:
            self.fail(prefix + key, "a non-empty string", value)
        return value


def _load_yaml(path):
    try:
        import yaml
    except ImportError:
        die(f"--config_file {path}: reading Accelerate's YAML needs python3-yaml (apt install python3-yaml; "
            f"tools/install-deps.sh installs it)")
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        die(f"--config_file {path}: cannot read it: {e.strerror}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        die(f"{path}{where}: not valid YAML: {getattr(e, 'problem', None) or e}")
    if not isinstance(data, dict):
        die(f"{path}: an Accelerate config file is a mapping of keys (distributed_type: DEEPSPEED, ...)")
    return data


def _refuse_ignored(r, plugin, config_file):
    given = [k for k in plugin if k in IGNORED_WITH_CONFIG_FILE or k in NVME_PATHS]
    if not given:
        return
    listed = list(IGNORED_WITH_CONFIG_FILE[:-1]) + [k for k in NVME_PATHS if k in plugin] + ["mixed_precision"]
    die("When using `deepspeed_config_file`, the following accelerate config variables will be ignored:\n"
        f"{listed}.\n"
        f"{r.path} gives {', '.join('deepspeed_config.' + k for k in given)} beside deepspeed_config_file "
        f"{config_file}: set them in that DeepSpeed file and remove them from {r.path}; "
        "`tessera config new` writes an Accelerate-style setup without them.")


def _plugin_config(r, plugin, precision):
    """The DeepSpeed config Accelerate's DeepSpeedPlugin builds from the plugin's variables."""
    p = "deepspeed_config."
    stage = r.integer(plugin, "zero_stage", p, 0, 3, default=2)
    zero = {"stage": stage}
    for what in ("optimizer", "param"):
        device = r.choice(plugin, f"offload_{what}_device", p, OFFLOAD_DEVICES, "none")
        nvme_path = r.text(plugin, f"offload_{what}_nvme_path", p)
        if device == "nvme" and nvme_path is None:
            die(f"{r.path}: {p}offload_{what}_device is nvme: {p}offload_{what}_nvme_path must name the directory")
        if device != "none":
            section = {"device": device}
            if device == "nvme":
                section["nvme_path"] = nvme_path
            zero[f"offload_{what}"] = section
    if "zero3_save_16bit_model" in plugin:
        zero["stage3_gather_16bit_weights_on_model_save"] = r.boolean(plugin, "zero3_save_16bit_model", p)
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": r.integer(plugin, "gradient_accumulation_steps", p, 1, default=1)}
    clipping = plugin.get("gradient_clipping")
    if clipping is not None and not (isinstance(clipping, str) and clipping.lower() == "none"):
        if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping <= 0:
            r.fail(p + "gradient_clipping", "a number > 0", clipping)
        config["gradient_clipping"] = float(clipping)
    config["zero_optimization"] = zero
    if precision in ("fp16", "bf16"):
        config[precision] = {"enabled": True}
    return config, stage


def _file_config(r, config_file, precision):
    """The deepspeed_config_file's JSON, its "auto" precision filled from mixed_precision."""
    try:
        with open(config_file) as f:
            config = json.load(f)
    except OSError as e:
        die(f"{r.path}: deepspeed_config.deepspeed_config_file {config_file}: cannot read it: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{config_file}:{e.lineno}: not valid JSON ({e.msg}); named by {r.path}'s deepspeed_config_file")
    if not isinstance(config, dict):
        die(f"{config_file}: a DeepSpeed config is a JSON object; named by {r.path}'s deepspeed_config_file")
    if precision is None:
        return config
    for section in ("fp16", "bf16"):
        wanted = precision == section
        table = config.get(section)
        if table is None:
            if wanted:
                config[section] = {"enabled": True}
            continue
        if not isinstance(table, dict):
            continue  # the engine's loader names it
        enabled = table.get("enabled", False)
        if enabled == "auto":
            table["enabled"] = wanted
        elif enabled is True and not wanted and precision != "no":
            die(f"{r.path}: mixed_precision is {precision} but {config_file} enables {section} "
                f"({section}.enabled = true): make them agree, or write \"auto\" in the file")
    return config


def read_accelerate_config(path):
    """Reads and checks an Accelerate config file; any problem ends the launcher, naming the file and key."""
    r = _Reader(path, _load_yaml(path))
    data = r.data
    unknown = sorted(k for k in data if k not in LAUNCH_KEYS | INERT_KEYS)
    if unknown:
        die(f"{path}: unknown keys {', '.join(unknown)} (Accelerate's config file has distributed_type, "
            "deepspeed_config, mixed_precision, num_processes, num_machines, machine_rank, main_process_ip, ...)")
    dtype = str(data.get("distributed_type", "")).upper()
    if dtype != "DEEPSPEED":
        die(f"{path}: distributed_type: tessera-launch runs DeepSpeed-style jobs: expected DEEPSPEED, "
            f"got {data.get('distributed_type')!r}")
    if str(data.get("compute_environment", "LOCAL_MACHINE")) != "LOCAL_MACHINE":
        die(f"{path}: compute_environment: only LOCAL_MACHINE is supported, got {data['compute_environment']!r}")
    if data.get("fsdp_config"):
        die(f"{path}: fsdp_config: set with distributed_type DEEPSPEED; remove it (tessera is not FSDP)")
    plugin = data.get("deepspeed_config") or {}
    if not isinstance(plugin, dict):
        r.fail("deepspeed_config", "a mapping", plugin)
    unknown = sorted(k for k in plugin if k not in PLUGIN_KEYS)
    if unknown:
        die(f"{path}: deepspeed_config: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(PLUGIN_KEYS))})")
    if data.get("mixed_precision") is False:  # YAML 1.1 reads an unquoted `no` as false
        data["mixed_precision"] = "no"
    precision = r.choice(data, "mixed_precision", "", PRECISIONS, None) if "mixed_precision" in data else None
    if "mixed_precision" in data and precision is None:
        precision = "no"
    p = "deepspeed_config."
    zero3_init = r.boolean(plugin, "zero3_init_flag", p) if "zero3_init_flag" in plugin else False
    config_file = r.text(plugin, "deepspeed_config_file", p)
    notes = []
    dynamo = str(data.get("dynamo_backend") or "NO")
    if dynamo.upper() != "NO":
        notes.append(f"{path}: dynamo_backend {dynamo}: tessera does not compile the model; not used")
    if config_file is not None:
        _refuse_ignored(r, plugin, config_file)
        config = _file_config(r, config_file, precision)
        origin = f"{config_file} (deepspeed_config_file of {path})"
        stage = config.get("zero_optimization", {}).get("stage") if isinstance(config.get("zero_optimization"), dict) else None
    else:
        config, stage = _plugin_config(r, plugin, precision or "no")
        origin = f"{path} (Accelerate's DeepSpeed plugin)"
    classes = plugin.get("deepspeed_moe_layer_cls_names")
    if classes is not None:
        names = classes if isinstance(classes, list) else str(classes).split(",")
        names = [str(n).strip() for n in names if str(n).strip()]
        if not names:
            r.fail(p + "deepspeed_moe_layer_cls_names", "class names, comma-separated", classes)
        zero = config.setdefault("zero_optimization", {})
        leaf = zero.setdefault("leaf_module", {})
        leaf["classes"] = list(dict.fromkeys(list(leaf.get("classes", [])) + names))
    if zero3_init and isinstance(stage, int) and stage != 3:
        notes.append(f"{path}: zero3_init_flag applies only at ZeRO stage 3 (the stage is {stage}): not used")
        zero3_init = False
    launch = AccelerateLaunch(path=path, deepspeed_config=config, origin=origin, plugin_fields=[k for k in plugin if k in IGNORED_WITH_CONFIG_FILE or k in NVME_PATHS],
                              zero3_init=zero3_init, notes=notes)
    launch.num_machines = r.integer(data, "num_machines", "", 1, default=1)
    launch.machine_rank = r.integer(data, "machine_rank", "", 0, launch.num_machines - 1, default=0)
    launch.num_processes = r.integer(data, "num_processes", "", 1, default=None)
    if launch.num_processes is not None and launch.num_processes % launch.num_machines:
        die(f"{path}: num_processes {launch.num_processes} (all machines together) is not a multiple of "
            f"num_machines {launch.num_machines}")
    launch.main_process_ip = r.text(data, "main_process_ip", "")
    launch.main_process_port = r.integer(data, "main_process_port", "", 1, 65534, default=None)
    gpu_ids = data.get("gpu_ids")
    if gpu_ids is not None and str(gpu_ids).lower() != "all":
        ids = [i.strip() for i in str(gpu_ids).split(",") if i.strip()]
        if not ids or not all(i.isdigit() for i in ids):
            r.fail("gpu_ids", "all, or device indices separated by commas", gpu_ids)
        launch.visible_devices = ",".join(ids)
    launch.hostfile = r.text(plugin, "deepspeed_hostfile", p)
    launch.include = r.text(plugin, "deepspeed_inclusion_filter", p) or ""
    launch.exclude = r.text(plugin, "deepspeed_exclusion_filter", p) or ""
    if "deepspeed_multinode_launcher" in plugin:
        launch.launcher = r.choice(plugin, "deepspeed_multinode_launcher", p, MULTINODE_LAUNCHERS, "pdsh")
    if launch.hostfile is not None and not os.path.isfile(launch.hostfile):
        die(f"{path}: deepspeed_config.deepspeed_hostfile {launch.hostfile}: no such file")
    return launch
