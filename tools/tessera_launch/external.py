"""Ranks started by another launcher (slurm's srun, an MPI's mpirun): their variables mapped to torchrun's."""
import os
import shutil
import subprocess

from .common import port_variables


# Each MPI flavour's rank variables: (name, rank, size, local rank, local size).
MPI_FLAVOURS = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    # MPICH's Hydra (also Intel MPI): PMI_* for the world, MPI_LOCAL* for this node.
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
# What a test or a nested launch clears so that it is not taken for a rank of an outer launcher.
EXTERNAL_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL")


def mpi_env(env):
    """(flavour, variables) of the first MPI flavour whose rank and size are set, else (None, None)."""
    for flavour, rank, size, local_rank, local_size in MPI_FLAVOURS:
        if rank in env and size in env:
            return flavour, {"RANK": env[rank], "WORLD_SIZE": env[size], "LOCAL_RANK": env.get(local_rank, "0"),
                             "LOCAL_WORLD_SIZE": env.get(local_size, "1")}
    return None, None


def slurm_local_size(env):
    """This node's task count: SLURM_NTASKS_PER_NODE, else this node's entry of SLURM_TASKS_PER_NODE
    ("2(x3),1": three nodes of 2, then one of 1)."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return env["SLURM_NTASKS_PER_NODE"]
    node = int(env.get("SLURM_NODEID", "0"))
    counts = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        if not part:
            continue
        if "(x" in part:
            n, rep = part.rstrip(")").split("(x")
            counts += [n] * int(rep)
        else:
            counts.append(part)
    return counts[node] if node < len(counts) else "1"


def external_env(args):
    """The rank variables of an external launcher and its name, or (None, None) when not started by one."""
    env = os.environ
    def port():
        return port_variables(args.master_port or int(env.get("MASTER_PORT", "29500")))

    flavour, ranks = mpi_env(env)
    if ranks is not None:
        return {**ranks, "MASTER_ADDR": args.master_addr or env.get("MASTER_ADDR", "127.0.0.1"), **port()}, flavour
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        master = args.master_addr or env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_JOB_NODELIST", ""))
        return {
            "RANK": env["SLURM_PROCID"],
            "WORLD_SIZE": env["SLURM_NTASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "LOCAL_WORLD_SIZE": slurm_local_size(env),
            "MASTER_ADDR": master or "127.0.0.1",
            **port(),
        }, "slurm"
    return None, None


def first_slurm_host(nodelist):
    """'node[03-05,9],gpu1' -> 'node03' (scontrol when available)."""
    if not nodelist:
        return None
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=10).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" in head:
        prefix, rest = head.split("[", 1)
        first = rest.split(",")[0].split("-")[0].rstrip("]")
        return prefix + first
    return head
