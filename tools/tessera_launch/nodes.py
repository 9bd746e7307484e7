"""Multi-node launches: one node launcher per host over pdsh or ssh, supervised like ranks."""
import base64
import json
import os
import shlex
import shutil
import signal
import sys
import time

from .common import PROG, forwarded_names, store_secret
from .supervisor import Supervisor


def launch_nodes(args, world, world_size, master_addr, master_port, job, program):
    """Starts one node launcher per host over pdsh or ssh; supervises those like ranks."""
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    me = os.path.abspath(sys.argv[0])
    cwd = os.getcwd()
    # The store's secret never goes on a command line: node launchers read it from a file only this
    # user can read, in the working directory that every host shares (as the program itself).
    exports = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in forwarded_names(os.environ))
    secret_file = os.path.join(cwd, f".tessera-secret-{job}-{os.getpid()}")
    if not args.dry_run:
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(store_secret())

    def node_command(node_rank):
        cmd = [me, "--no-external", "--world-info", info, "--node-rank", str(node_rank),
               "--master-addr", master_addr, "--master-port", str(master_port), "--job", job,
               "--grace-period", str(args.grace_period), "--heartbeat-timeout", str(args.heartbeat_timeout),
               "--secret-file", secret_file]
        if args.no_prefix:
            cmd.append("--no-prefix")
        if args.bind_cores_to_rank:
            cmd.append("--bind-cores-to-rank")
            if args.bind_core_list:
                cmd += ["--bind-core-list", args.bind_core_list]
        return f"cd {shlex.quote(cwd)} && {exports} {shlex.join(cmd + ['--'] + program)}"

    use_pdsh = args.launcher == "pdsh" or (args.launcher in (None, "auto") and shutil.which("pdsh"))
    if use_pdsh:
        hosts = ",".join(h for h, _, _ in world)
        # pdsh replaces %n by the node's index in the -w list.
        commands = [(None, ["pdsh", "-S", "-f", "1024", "-w", hosts, node_command("%n")])]
    else:
        commands = [(i, ["ssh", "-o", "BatchMode=yes", host, node_command(i)]) for i, (host, _, _) in enumerate(world)]
    if args.dry_run:
        for host, first, slots in world:
            print(f"{PROG}: host {host}: ranks {first}..{first + len(slots) - 1} slots {','.join(map(str, slots))}")
        for _, cmd in commands:
            print(f"{PROG}: " + shlex.join(cmd))
        return 0
    try:
        return supervise_nodes(args, world, commands)
    finally:
        try:
            os.unlink(secret_file)
        except OSError:
            pass


def supervise_nodes(args, world, commands):
    # Node launchers prefix their own ranks' lines: no prefix here.
    nodes = [(i if i is not None else 0, 0, {}) for i, _ in commands]
    sup = Supervisor(nodes, None, dict(os.environ), args.grace_period, False, heartbeat_timeout_s=0)
    sup_procs = {}
    for (i, cmd), node in zip(commands, nodes):
        sup.program = cmd
        sup.ranks = [node]
        sup.start()
        sup_procs.update(sup.procs)
    sup.ranks = nodes
    sup.procs = sup_procs
    signal.signal(signal.SIGINT, sup.on_signal)
    signal.signal(signal.SIGTERM, sup.on_signal)
    while True:
        codes = {n: p.poll() for n, p in sup.procs.items()}
        bad = [(n, c) for n, c in codes.items() if c not in (None, 0)]
        if bad:
            sup.end_others()
            n, c = bad[0]
            sys.stderr.write(f"{PROG}: node launcher {n} ({world[n][0] if n < len(world) else '?'}) exited "
                             f"with status {c}; ended the other nodes\n")
            return c if c > 0 else 128 - c
        if all(c == 0 for c in codes.values()):
            return 0
        time.sleep(0.1)
