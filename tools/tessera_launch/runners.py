"""The MPI and slurm launchers (DeepSpeed's openmpi, mpich, mvapich and slurm runners): one command that
starts every rank, each rank running `tessera-launch -- PROGRAM`, which maps that launcher's rank
variables (external.py) and execs PROGRAM.

The world comes from the hostfile (host order, each host's slot count); those launchers place ranks
by count, so a selection of single slots (--include host:1) is refused: it needs ssh or pdsh. The
store's secret and the forwarded variables travel by name (mpirun -x, -genvlist, srun --export),
never by value on a command line; mpirun_rsh has no such option and exports the whole environment.
"""
import os
import shlex

from .common import PROG, SECRET_VAR, die, forwarded_names

MPI_LAUNCHERS = ("openmpi", "mpich", "mvapich", "slurm")


def _counts(launcher, world):
    """[(host, count)]; refuses slot selections an MPI launcher cannot express."""
    out = []
    for host, _, slots in world:
        if slots != list(range(len(slots))):
            die(f"--launcher {launcher}: host {host} uses slots {','.join(map(str, slots))}, but {launcher} places "
                f"ranks by count, not by slot; select whole hosts or use --launcher ssh or pdsh")
        out.append((host, len(slots)))
    return out


def rank_command(me, master_addr, master_port, job, program):
    """What each rank runs: this launcher in its external mode, then PROGRAM."""
    cmd = [me, "--master-port", str(master_port), "--job", job]
    if master_addr is not None:
        cmd += ["--master-addr", master_addr]
    return cmd + ["--"] + list(program)


def mpi_command(launcher, world, world_size, extra_args, rank_cmd, hostfile_path=None, nnodes=None, nproc=None):
    """The argv of the launcher's command, and the (path, text) of a hostfile it needs written, if any."""
    names = forwarded_names(os.environ) + [SECRET_VAR]
    extra = shlex.split(extra_args) if extra_args else []
    if launcher == "slurm":
        cmd = ["srun", "-n", str(world_size)]
        if world is not None:
            counts = _counts(launcher, world)
            if len({n for _, n in counts}) != 1:
                die("--launcher slurm: every host needs the same number of slots (srun's --ntasks-per-node), got " +
                    ", ".join(f"{h}={n}" for h, n in counts))
            cmd += ["--nodes", str(len(counts)), "--ntasks-per-node", str(counts[0][1]),
                    "--nodelist", ",".join(h for h, _ in counts)]
        else:  # inside an allocation: --nnodes x --nproc-per-node
            cmd += ["--nodes", str(nnodes), "--ntasks-per-node", str(nproc)]
        # ALL keeps the caller's environment, the secret included, without writing any value here.
        return cmd + ["--export", "ALL"] + extra + rank_cmd, None
    counts = _counts(launcher, world)
    if launcher == "openmpi":
        cmd = ["mpirun", "-n", str(world_size), "--host", ",".join(f"{h}:{n}" for h, n in counts)]
        for name in names:
            cmd += ["-x", name]
        return cmd + extra + rank_cmd, None
    if launcher == "mpich":  # Hydra: -hosts h:n, -genvlist passes variables by name
        cmd = ["mpirun", "-n", str(world_size), "-hosts", ",".join(f"{h}:{n}" for h, n in counts),
               "-genvlist", ",".join(names)]
        return cmd + extra + rank_cmd, None
    if launcher == "mvapich":  # mpirun_rsh: a "host:n" hostfile; -export sends the environment
        text = "".join(f"{h}:{n}\n" for h, n in counts)
        return ["mpirun_rsh", "-export", "-np", str(world_size), "-hostfile", hostfile_path] + extra + rank_cmd, \
            (hostfile_path, text)
    raise AssertionError(launcher)


def print_dry_run(cmd, hostfile):
    if hostfile is not None:
        print(f"{PROG}: hostfile {hostfile[0]}: " + hostfile[1].strip().replace("\n", " "))
    print(f"{PROG}: " + shlex.join(cmd))
