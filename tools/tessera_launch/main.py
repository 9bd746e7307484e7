"""tessera-launch: start one process per device ("rank") of a tessera job.

Usage:
  tessera-launch [options] [--] PROGRAM [ARGS...]

Every rank gets, like torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, and TESSERA_JOB (the store namespace given by --job). tessera's store listens on
--master-port P (TESSERA_STORE_PORT=P); MASTER_PORT is P + 1, left to a script that also starts
torch.distributed (env://), whose own store would otherwise take tessera's port. Unless set already, local
ranks also get OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = this node's cores / its ranks (at least
1): OpenBLAS keeps its own thread pool, which LibTorch's set_num_threads does not reach, so
without it every rank would start one thread per core and the ranks would oversubscribe them.

Modes, chosen in this order:
  1. Started by slurm (srun sets SLURM_PROCID) or by an MPI's mpirun (OpenMPI's OMPI_COMM_WORLD_*,
     MVAPICH's MV2_COMM_WORLD_*, MPICH/Hydra's PMI_RANK/PMI_SIZE): the launcher spawns nothing; it
     maps that launcher's variables to the ones above and execs PROGRAM. Not when --launcher is given.
  2. --launcher openmpi | mpich | mvapich | slurm: one mpirun / mpirun_rsh / srun command that starts
     every rank of the hostfile's world (slurm: or --nnodes x --nproc-per-node in an allocation), each
     in mode 1 (runners.py). --launcher-args adds options to that command.
  3. --hostfile with more than one (selected) host, --launcher auto | ssh | pdsh: one node launcher
     per host, over pdsh when it is installed (auto), over ssh otherwise. Each runs mode 4 on its host.
  4. Local: --nproc-per-node processes on this node, ranks node_rank*nproc .. +nproc-1; with a
     hostfile, the ranks of this host's slots, or with --launcher nossh those of the hostfile's
     --node-rank'th host (run it on every host, as DeepSpeed's nossh). --launcher standard is this
     mode without a hostfile (torchrun's way: --nnodes, --node-rank, --master-addr on every node).

Accelerate's config file (--config_file accelerate.yaml, accelerate_config.py): its DeepSpeed plugin
or deepspeed_config_file becomes the ranks' config (TESSERA_LAUNCH_CONFIG_JSON); num_processes (all
machines), num_machines, machine_rank, main_process_ip/port, deepspeed_hostfile, the inclusion and
exclusion filters and deepspeed_multinode_launcher set what the command line does not.

Hostfile (DeepSpeed's format): one "HOST slots=N" per line, '#' comments. --include/--exclude as
in DeepSpeed: "host1@host2:0,2" selects all slots of host1 and slots 0 and 2 of host2; --exclude
removes such hosts or slots. The selected slots of a host are given to its ranks in order (also
exported as CUDA_VISIBLE_DEVICES when a subset of slots is selected, as DeepSpeed does).

Supervision (local mode): every output line is prefixed with "[rank<R>]: "; SIGINT and SIGTERM
are forwarded to every rank; when a rank exits non-zero or is killed by a signal, the launcher
sends SIGTERM to the others, SIGKILL after --grace-period seconds, prints one line naming the rank
and its status or signal, and exits with that status (128+N for signal N). Liveness: each rank
beats once a second on a socket from a dedicated thread (TESSERA_HEARTBEAT_FD; transport/liveness.h),
saying which collectives it has been waiting in; when a rank that has beaten is silent for
--heartbeat-timeout seconds (a stopped or frozen process), the launcher ends the job, names that
rank and what the others wait in, and exits with status 75. A rank that waits long in a live
collective keeps beating and keeps the collective's own timeout.
"""

import argparse
import base64
import json
import os
import shlex
import socket
import subprocess
import sys

from .accelerate_config import MULTINODE_LAUNCHERS, read_accelerate_config
from .common import PROG, SECRET_VAR, die, port_variables, store_secret
from .cores import cpu_list_text, rank_cpu_sets
from .external import external_env
from .hostfile import is_local_host, parse_hostfile, select_resources, world_from_resources
from .nodes import launch_nodes
from .runners import MPI_LAUNCHERS, mpi_command, print_dry_run, rank_command
from .supervisor import Supervisor


LAUNCHERS = ("auto", "ssh") + MULTINODE_LAUNCHERS


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description="Start the ranks of a tessera job.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node (default 1)")
    p.add_argument("--nnodes", type=int, default=None, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=None, help="index of this node (default 0)")
    p.add_argument("--master-addr", default=None, help="address of rank 0's store (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None, help="port of rank 0's store (default 29500)")
    p.add_argument("--hostfile", default=None, help="DeepSpeed hostfile: lines 'HOST slots=N'")
    p.add_argument("--include", default="", help="hosts/slots to use, e.g. 'host1@host2:0,1'")
    p.add_argument("--exclude", default="", help="hosts/slots to leave out, e.g. 'host1:0'")
    p.add_argument("--job", default=None, help="job name: the store namespace (TESSERA_JOB, default 'default')")
    p.add_argument("--config_file", "--config-file", dest="config_file", default=None,
                   help="an Accelerate config file (accelerate config's YAML, distributed_type: DEEPSPEED)")
    # A rank with [tessera.checkpoint] sigterm_save_dir saves at its next step after SIGTERM: the
    # grace period must cover a step plus a save (this rank's share of the state at the disk's
    # speed: ~4 GB per rank at 200 MB/s in 20 s), so the default leaves 30 s.
    p.add_argument("--grace-period", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL (default 30: room for a step and a checkpoint save)")
    p.add_argument("--heartbeat-timeout", type=float, default=8.0,
                   help="end the job when a rank that beats falls silent this long (seconds; 0 = never; default 8)")
    p.add_argument("--bind-cores-to-rank", "--bind_cores_to_rank", dest="bind_cores_to_rank", action="store_true",
                   help="bind each rank of a node to its own share of the node's cores (OMP_NUM_THREADS = its share)")
    p.add_argument("--bind-core-list", "--bind_core_list", dest="bind_core_list", default=None,
                   help="the cores --bind-cores-to-rank shares out, e.g. '0-15,32-47' (default: all this launcher may use)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    p.add_argument("--launcher", choices=LAUNCHERS, default=None,
                   help="multi-node launcher (default auto: pdsh when installed, else ssh)")
    p.add_argument("--launcher-args", default="", help="options added to the mpirun/mpirun_rsh/srun command")
    p.add_argument("--no-external", action="store_true", help="ignore SLURM_*/OMPI_*/PMI_*/MV2_* variables")
    p.add_argument("--dry-run", action="store_true", help="print what would run, start nothing")
    p.add_argument("--world-info", default=None, help=argparse.SUPPRESS)
    p.add_argument("--secret-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def apply_accelerate(args):
    """Fills what the command line left open from --config_file; puts the config in the environment."""
    acc = read_accelerate_config(args.config_file)
    for note in acc.notes:
        sys.stderr.write(f"{PROG}: note: {note}\n")
    os.environ.update(acc.environment())
    if args.nproc_per_node is None and acc.num_processes is not None:
        args.nproc_per_node = acc.num_processes // acc.num_machines
        if args.nnodes is None:
            args.nnodes = acc.num_machines
        if args.node_rank is None:
            args.node_rank = acc.machine_rank
    args.master_addr = args.master_addr or acc.main_process_ip
    args.master_port = args.master_port or acc.main_process_port
    args.hostfile = args.hostfile or acc.hostfile
    args.include = args.include or acc.include
    args.exclude = args.exclude or acc.exclude
    args.launcher = args.launcher or acc.launcher
    return acc


def exec_external(args, job, program):
    """Mode 1: a rank of slurm or an MPI; None when not started by one."""
    ext, source = external_env(args)
    if ext is None:
        return None
    ext["TESSERA_JOB"] = job
    if args.dry_run:
        print(f"{PROG}: started by {source}: " + " ".join(f"{k}={v}" for k, v in ext.items()) +
              " " + shlex.join(program))
        return 0
    env = dict(os.environ)
    env.update(ext)
    try:
        os.execvpe(program[0], program, env)
    except OSError as e:
        die(f"cannot run {program[0]}: {e.strerror}", 127)


def hostfile_world(args):
    hosts = parse_hostfile(args.hostfile)
    return world_from_resources(select_resources(hosts, args.include, args.exclude))


def launch_mpi(args, job, program, master_port):
    """Mode 2: one mpirun / mpirun_rsh / srun command for every rank."""
    world, world_size = hostfile_world(args) if args.hostfile else (None, None)
    if world is None and args.launcher != "slurm":
        die(f"--launcher {args.launcher} needs --hostfile (lines 'HOST slots=N', or deepspeed_hostfile)")
    nnodes, nproc = args.nnodes or 1, args.nproc_per_node or 1
    if world is None:
        world_size = nnodes * nproc
    master_addr = args.master_addr or (world[0][0] if world else None)  # slurm: its first node
    me = os.path.abspath(sys.argv[0])
    hostfile_path = os.path.join(os.getcwd(), f".tessera-mvapich-hosts-{job}-{os.getpid()}")
    cmd, hostfile = mpi_command(args.launcher, world, world_size, args.launcher_args,
                                rank_command(me, master_addr, master_port, job, program), hostfile_path, nnodes, nproc)
    if args.dry_run:
        print_dry_run(cmd, hostfile)
        return 0
    store_secret()
    if hostfile is not None:
        with open(hostfile[0], "w") as f:
            f.write(hostfile[1])
    try:
        return subprocess.run(cmd).returncode
    except FileNotFoundError:
        die(f"--launcher {args.launcher}: {cmd[0]} is not installed (or not on PATH)", 127)
    finally:
        if hostfile is not None:
            os.unlink(hostfile[0])


def main(argv):
    args = build_parser().parse_args(argv)
    program = args.program
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        die("no program given")
    cli_launcher = args.launcher
    if args.config_file:
        apply_accelerate(args)
        if args.dry_run:
            print(f"{PROG}: config ({os.environ['TESSERA_LAUNCH_CONFIG_ORIGIN']}): "
                  f"{os.environ['TESSERA_LAUNCH_CONFIG_JSON']}")
    job = args.job or os.environ.get("TESSERA_JOB", "default")
    if args.secret_file:  # a node launcher: the store's secret comes in a file, not on the command line
        try:
            with open(args.secret_file) as f:
                os.environ[SECRET_VAR] = f.read().strip()
        except OSError as e:
            die(f"cannot read the store secret file {args.secret_file}: {e.strerror}")

    # A launcher named on the command line is never itself a rank of an outer one.
    if not args.no_external and not args.world_info and cli_launcher is None:
        started = exec_external(args, job, program)
        if started is not None:
            return started
    launcher = args.launcher or "auto"
    master_port = args.master_port or 29500
    if args.bind_core_list and not args.bind_cores_to_rank:
        die("--bind-core-list needs --bind-cores-to-rank")
    if args.bind_cores_to_rank and launcher in MPI_LAUNCHERS:
        die(f"--bind-cores-to-rank: with --launcher {launcher} the MPI launcher starts the ranks; use its own "
            "binding (mpirun --bind-to core, srun --cpu-bind=cores) through --launcher-args")
    if launcher in MPI_LAUNCHERS:
        return launch_mpi(args, job, program, master_port)
    master_addr = args.master_addr or "127.0.0.1"
    node_rank = args.node_rank or 0
    nnodes = args.nnodes or 1

    # The world: from --world-info (a node launcher), a hostfile, or --nnodes x --nproc-per-node.
    if args.world_info:
        world = [tuple(x) for x in json.loads(base64.urlsafe_b64decode(args.world_info.encode()).decode())]
        world_size = sum(len(w[2]) for w in world)
        host, first_rank, slots = world[node_rank]
        local = [(first_rank + i, i, slots) for i in range(len(slots))]
    elif args.hostfile:
        if launcher == "standard":
            die("--launcher standard starts this node's ranks from --nnodes/--node-rank/--nproc-per-node "
                "(torchrun's way), not from a hostfile; with a hostfile on every node use --launcher nossh")
        world, world_size = hostfile_world(args)
        all_local = all(is_local_host(h) for h, _, _ in world)
        if args.master_addr is None:
            # Other hosts reach rank 0's store by a name that means this host to them, not "localhost".
            first = world[0][0]
            master_addr = "127.0.0.1" if all_local else (socket.gethostname() if first in ("localhost", "127.0.0.1", "::1")
                                                          else first)
        if launcher == "nossh":
            if not 0 <= node_rank < len(world):
                die(f"--launcher nossh: --node-rank {node_rank}: the hostfile's world has hosts 0..{len(world) - 1}")
            host, first_rank, slots = world[node_rank]
        elif len(world) > 1 or not all_local:
            return launch_nodes(args, world, world_size, master_addr, master_port, job, program)
        else:
            host, first_rank, slots = world[0]
        local = [(first_rank + i, i, slots) for i in range(len(slots))]
    else:
        if args.include or args.exclude:
            die("--include/--exclude need --hostfile")
        if launcher == "nossh":
            die("--launcher nossh needs --hostfile (every host runs tessera-launch with its --node-rank)")
        nproc = args.nproc_per_node or 1
        if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
            die("need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes")
        world_size = nproc * nnodes
        slots = list(range(nproc))
        local = [(node_rank * nproc + i, i, slots) for i in range(nproc)]
        world = None

    ranks = []
    secret = store_secret()
    cpu_sets = rank_cpu_sets(len(local), args.bind_core_list) if args.bind_cores_to_rank else None
    for rank, local_rank, slots in local:
        extra = {
            "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(len(local)), "MASTER_ADDR": master_addr, **port_variables(master_port),
            "TESSERA_JOB": job,
        }
        if cpu_sets:  # the supervisor binds the rank to these before it execs the program
            extra["TESSERA_CPU_LIST"] = cpu_list_text(cpu_sets[local_rank])
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            if var not in os.environ:
                share = len(cpu_sets[local_rank]) if cpu_sets else (os.cpu_count() or 1) // len(local)
                extra[var] = str(max(1, share))
        if world is not None and (len(slots) != max(slots) + 1 or slots != sorted(slots)):
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
        ranks.append((rank, local_rank, extra))

    if args.dry_run:
        for rank, local_rank, extra in ranks:
            print(f"{PROG}: " + " ".join(f"{k}={v}" for k, v in extra.items()) + " " + shlex.join(program))
        return 0
    base_env = dict(os.environ)
    base_env[SECRET_VAR] = secret  # in the environment only (never printed, never on a command line)
    sup = Supervisor(ranks, program, base_env, args.grace_period, not args.no_prefix, args.heartbeat_timeout)
    return sup.run()
