#!/usr/bin/env python3
"""tessera-launch's multi-node launchers (python3 launchers_test.py [Class]).

DryRuns: the commands of openmpi, mpich, mvapich and slurm, with the store's secret never printed.
MpiEnv: each MPI flavour's rank variables, mapped to torchrun's. MpiRuns: real mpirun launches with
Debian's OpenMPI and MPICH. TwoNodes: real two-"node" jobs on
this machine (standard and nossh: one launcher per node), running the collectives test's "every
collective on the whole job" over Gloo; with root and `ip`, the nossh and standard jobs again across two
network namespaces joined by a veth pair, each node seeing only its own address. Needs TESSERA_COLLECTIVES_TEST.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.environ.get("TESSERA_LAUNCH", os.path.join(HERE, "..", "..", "tools", "tessera-launch"))
CLEARED = ("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL", "TESSERA_LAUNCH_")
SECRET = "f00dfeedsecret0123456789"


def env_without_launchers(extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    e["TESSERA_STORE_SECRET"] = SECRET
    e.update(extra or {})
    return e


def launch(args, env=None, timeout=60, prefix=()):
    return subprocess.run(list(prefix) + [sys.executable, LAUNCH] + args, capture_output=True, text=True,
                          timeout=timeout, env=env_without_launchers(env))


class HostfileCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.hostfile = os.path.join(self.dir.name, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("node1 slots=2\nnode2 slots=2\n")

    def tearDown(self):
        self.dir.cleanup()

    def dry(self, launcher, *args):
        r = launch(["--hostfile", self.hostfile, "--launcher", launcher, "--dry-run"] + list(args) + ["--", "prog", "x"])
        self.assertNotIn(SECRET, r.stdout + r.stderr)
        return r


class DryRuns(HostfileCase):
    def rank_command(self, line, addr="node1"):
        tail = f"--master-port 29500 --job default --master-addr {addr} -- prog x" if addr else \
            "--master-port 29500 --job default -- prog x"
        self.assertTrue(line.endswith(tail), line)
        self.assertIn("tessera-launch", line)

    def test_openmpi(self):
        r = self.dry("openmpi", "--launcher-args", "--mca btl ^openib")
        self.assertEqual(r.returncode, 0, r.stderr)
        (line,) = r.stdout.splitlines()
        self.assertTrue(line.startswith("tessera-launch: mpirun -n 4 --host node1:2,node2:2 "), line)
        self.assertIn(" -x TESSERA_STORE_SECRET ", line)  # by name only
        self.assertIn("--mca btl '^openib'", line)
        self.rank_command(line)

    def test_mpich(self):
        r = self.dry("mpich")
        self.assertEqual(r.returncode, 0, r.stderr)
        (line,) = r.stdout.splitlines()
        self.assertTrue(line.startswith("tessera-launch: mpirun -n 4 -hosts node1:2,node2:2 -genvlist "), line)
        self.assertIn("TESSERA_STORE_SECRET", line.split("-genvlist ")[1].split()[0])
        self.rank_command(line)

    def test_mvapich(self):
        r = self.dry("mvapich")
        self.assertEqual(r.returncode, 0, r.stderr)
        hosts, line = r.stdout.splitlines()
        self.assertTrue(hosts.endswith(": node1:2 node2:2"), hosts)
        self.assertTrue(line.startswith("tessera-launch: mpirun_rsh -export -np 4 -hostfile "), line)
        self.rank_command(line)

    def test_slurm(self):
        r = self.dry("slurm", "--exclude", "node2")
        self.assertEqual(r.returncode, 0, r.stderr)
        (line,) = r.stdout.splitlines()
        self.assertTrue(line.startswith("tessera-launch: srun -n 2 --nodes 1 --ntasks-per-node 2 --nodelist node1 "
                                        "--export ALL "), line)
        self.rank_command(line)
        # Inside an allocation: no hostfile, the first node of the job is the master (external.py).
        r = launch(["--launcher", "slurm", "--nnodes", "3", "--nproc-per-node", "4", "--dry-run", "--", "prog", "x"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("tessera-launch: srun -n 12 --nodes 3 --ntasks-per-node 4 --export ALL"))
        self.rank_command(r.stdout.strip(), addr=None)

    def test_refusals(self):
        r = self.dry("openmpi", "--include", "node1:1@node2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("host node1 uses slots 1, but openmpi places ranks by count", r.stderr)
        with open(self.hostfile, "w") as f:
            f.write("node1 slots=2\nnode2 slots=1\n")
        r = self.dry("slurm")
        self.assertEqual(r.returncode, 2)
        self.assertIn("every host needs the same number of slots", r.stderr)
        r = launch(["--launcher", "mpich", "--dry-run", "--", "prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--launcher mpich needs --hostfile", r.stderr)
        r = launch(["--launcher", "nossh", "--dry-run", "--", "prog"])
        self.assertIn("--launcher nossh needs --hostfile", r.stderr)
        r = self.dry("standard")
        self.assertIn("--launcher standard starts this node's ranks from --nnodes", r.stderr)
        r = self.dry("nossh", "--node-rank", "2")
        self.assertIn("--node-rank 2: the hostfile's world has hosts 0..1", r.stderr)

    def test_nossh_runs_one_host(self):
        r = self.dry("nossh", "--node-rank", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        ranks = [dict(i.split("=", 1) for i in line.split()[1:] if "=" in i) for line in r.stdout.splitlines()]
        self.assertEqual([(x["RANK"], x["LOCAL_RANK"], x["WORLD_SIZE"], x["MASTER_ADDR"]) for x in ranks],
                         [("2", "0", "4", "node1"), ("3", "1", "4", "node1")])

    def test_a_missing_mpirun_is_named(self):
        if shutil.which("mpirun"):
            self.skipTest("mpirun is installed")
        with open(self.hostfile, "w") as f:
            f.write("localhost slots=1\n")
        r = launch(["--hostfile", self.hostfile, "--launcher", "openmpi", "--", "true"])
        self.assertEqual(r.returncode, 127)
        self.assertIn("--launcher openmpi: mpirun is not installed", r.stderr)


class MpiEnv(unittest.TestCase):
    """A rank started by each MPI flavour sees torchrun's variables (the launcher execs the program)."""

    PRINT = [sys.executable, "-c", "import os; print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
             "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'TESSERA_STORE_PORT')))"]

    def test_flavours(self):
        cases = {
            "openmpi": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                        "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            "mvapich": {"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_SIZE": "8", "MV2_COMM_WORLD_LOCAL_RANK": "1",
                        "MV2_COMM_WORLD_LOCAL_SIZE": "4"},
            "mpich": {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
            "slurm": {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)",
                      "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"},
        }
        for flavour, env in cases.items():
            with self.subTest(flavour):
                args = ["--master-port", "31500", "--"] + self.PRINT
                if flavour != "slurm":
                    args = ["--master-addr", "node1"] + args
                r = launch(args, env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                addr = "gpu07" if flavour == "slurm" else "node1"
                self.assertEqual(r.stdout.split(), ["5", "8", "1", "4", addr, "31500"])
                r = launch(["--dry-run"] + args, env=env)
                self.assertIn(f"started by {flavour}:", r.stdout)

    def test_a_named_launcher_is_not_a_rank(self):
        r = launch(["--launcher", "standard", "--nproc-per-node", "1", "--"] + self.PRINT,
                   env={"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split()[1:3], ["0", "1"])  # [rank0]: 0 1 ...: its own single rank


COLLECTIVES = os.environ.get("TESSERA_COLLECTIVES_TEST")
TEST_ARGS = ["every collective on the whole job"]


def start(args, prefix=()):
    return subprocess.Popen(list(prefix) + [sys.executable, LAUNCH, "--grace-period", "2"] + args, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env_without_launchers())


def finish(test, procs, timeout=180):
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            test.fail("a node launcher did not finish")
        outs.append(out)
    for p, out in zip(procs, outs):
        test.assertEqual(p.returncode, 0, out)
        test.assertIn("All tests passed", out)
    return outs


@unittest.skipUnless(COLLECTIVES, "TESSERA_COLLECTIVES_TEST is not set")
class TwoNodes(unittest.TestCase):
    def test_standard(self):
        procs = [start(["--launcher", "standard", "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
                        "--master-port", "29661", "--job", "two_nodes_standard", "--", COLLECTIVES] + TEST_ARGS)
                 for n in range(2)]
        outs = finish(self, procs)
        self.assertIn("[rank0]", outs[0])
        self.assertIn("[rank1]", outs[1])

    def test_nossh(self):
        with tempfile.TemporaryDirectory() as d:
            hostfile = os.path.join(d, "hostfile")
            with open(hostfile, "w") as f:
                f.write("localhost slots=1\n127.0.0.1 slots=1\n")
            procs = [start(["--launcher", "nossh", "--hostfile", hostfile, "--node-rank", str(n), "--master-port",
                            "29663", "--job", "two_nodes_nossh", "--", COLLECTIVES] + TEST_ARGS) for n in range(2)]
            finish(self, procs)

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("ip"), "needs root and ip(8) for network namespaces")
    def test_nossh_and_standard_across_network_namespaces(self):
        tag = f"ts{os.getpid() % 100000}"
        ns = [f"{tag}a", f"{tag}b"]
        addrs = ["10.231.7.1", "10.231.7.2"]

        def ip(*args):
            subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=30)

        try:
            for n in ns:
                ip("netns", "add", n)
            ip("link", "add", f"{tag}0", "type", "veth", "peer", "name", f"{tag}1")
            for i, n in enumerate(ns):
                ip("link", "set", f"{tag}{i}", "netns", n)
                ip("-n", n, "addr", "add", f"{addrs[i]}/24", "dev", f"{tag}{i}")
                ip("-n", n, "link", "set", f"{tag}{i}", "up")
                ip("-n", n, "link", "set", "lo", "up")
            with tempfile.TemporaryDirectory() as d:
                hostfile = os.path.join(d, "hostfile")
                with open(hostfile, "w") as f:
                    f.write("".join(f"{a} slots=1\n" for a in addrs))
                # Each node binds and reaches only what its namespace has: 127.0.0.1 is its own.
                procs = [start(["--launcher", "nossh", "--hostfile", hostfile, "--node-rank", str(i), "--master-port",
                                "29665", "--job", "two_nodes_netns", "--", COLLECTIVES] + TEST_ARGS,
                               prefix=["ip", "netns", "exec", ns[i]]) for i in range(2)]
                outs = finish(self, procs)
                self.assertIn("[rank1]", outs[1])
            # standard (torchrun's way) across the same two namespaces, rank 0's address given to both.
            procs = [start(["--launcher", "standard", "--nnodes", "2", "--node-rank", str(i), "--master-addr", addrs[0],
                            "--master-port", "29667", "--job", "two_nodes_netns_standard", "--", COLLECTIVES] + TEST_ARGS,
                           prefix=["ip", "netns", "exec", ns[i]]) for i in range(2)]
            finish(self, procs)
        finally:
            for n in ns:
                subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


def mpirun_dir(d, flavour):
    """A folder whose `mpirun` is that flavour's (Debian installs both as mpirun.openmpi / mpirun.mpich, one of
    them behind the mpirun alternative); a script, not a link, so Hydra finds its proxy beside its own binary."""
    target = shutil.which(f"mpirun.{flavour}")
    if target is None:
        return None
    folder = os.path.join(d, flavour)
    os.makedirs(folder)
    with open(os.path.join(folder, "mpirun"), "w") as f:
        f.write(f"#!/bin/sh\nexec {target} \"$@\"\n")
    os.chmod(os.path.join(folder, "mpirun"), 0o755)
    return folder


@unittest.skipUnless(COLLECTIVES, "TESSERA_COLLECTIVES_TEST is not set")
class MpiRuns(unittest.TestCase):
    """Real mpirun launches (Debian's openmpi-bin and mpich, tools/install-deps.sh): two ranks on this host run
    the collectives test, each rank's variables mapped from its MPI's."""

    def run_flavour(self, flavour, port):
        with tempfile.TemporaryDirectory() as d:
            folder = mpirun_dir(d, flavour)
            if folder is None:
                self.skipTest(f"mpirun.{flavour} is not installed (tools/install-deps.sh installs it)")
            hostfile = os.path.join(d, "hostfile")
            with open(hostfile, "w") as f:
                f.write("localhost slots=2\n")
            env = env_without_launchers({"PATH": folder + os.pathsep + os.environ["PATH"],
                                         # OpenMPI refuses root without these (CI runs as root).
                                         "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
            r = subprocess.run([sys.executable, LAUNCH, "--hostfile", hostfile, "--launcher", flavour, "--master-port",
                                str(port), "--job", f"mpirun_{flavour}", "--", COLLECTIVES] + TEST_ARGS,
                               capture_output=True, text=True, timeout=240, env=env)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            self.assertEqual(r.stdout.count("All tests passed"), 2, r.stdout[-3000:])
            self.assertNotIn(SECRET, r.stdout + r.stderr)

    def test_openmpi(self):
        self.run_flavour("openmpi", 29671)

    def test_mpich(self):
        self.run_flavour("mpich", 29673)


if __name__ == "__main__":
    unittest.main(verbosity=1)
