"""--bind-cores-to-rank (DeepSpeed's launcher flag): the ranks of a node each get their own cores, so that
their optimizer steps, offloaded updates and intra-op threads do not fight over the same ones. The
node's cores (the launcher's own CPU affinity, or --bind-core-list) are grouped into physical cores
by the kernel's topology (hyperthreads of one core stay together), split into equal contiguous
shares in rank order, and each rank starts bound to its share (sched_setaffinity before exec,
inherited by every thread it starts) with OMP_NUM_THREADS set to its size unless the caller set it.

Example: 8 logical CPUs = 4 cores x 2 threads, 2 ranks: rank 0 gets cores 0-1 (4 CPUs), rank 1
cores 2-3 (4 CPUs), OMP_NUM_THREADS=4 each."""
import os

from .common import die


def parse_core_list(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            die(f"--bind-core-list {text!r}: {part!r} is not a CPU number or a range like 0-3")
        if first < 0 or last < first:
            die(f"--bind-core-list {text!r}: {part!r} is not a range of CPU numbers")
        cpus.update(range(first, last + 1))
    if not cpus:
        die(f"--bind-core-list {text!r}: no CPUs")
    return sorted(cpus)


def physical_cores(cpus):
    """Logical CPUs grouped by (package, core) as the kernel reports them, in the order of their first CPU."""
    groups = {}
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as a, open(base + "core_id") as b:
                key = (int(a.read()), int(b.read()))
        except (OSError, ValueError):
            key = ("cpu", cpu)  # no topology: every CPU is a core
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values(), key=lambda g: g[0])


def rank_cpu_sets(nproc, core_list=None):
    """One list of logical CPUs per local rank: equal shares of whole cores, the remainder to the first ranks."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed
    if core_list:
        cpus = parse_core_list(core_list)
        outside = sorted(set(cpus) - set(allowed))
        if outside:
            die(f"--bind-core-list {core_list!r}: CPUs {outside} are not available to this launcher "
                f"(its affinity is {allowed})")
    cores = physical_cores(cpus)
    if len(cores) < nproc:
        die(f"--bind-cores-to-rank: {nproc} ranks on this node but {len(cores)} cores "
            f"(CPUs {cpus}); start fewer ranks or leave out --bind-cores-to-rank")
    share, extra = divmod(len(cores), nproc)
    out, at = [], 0
    for r in range(nproc):
        n = share + (1 if r < extra else 0)
        out.append(sorted(c for core in cores[at:at + n] for c in core))
        at += n
    return out


def cpu_list_text(cpus):
    return ",".join(str(c) for c in cpus)
