#!/usr/bin/env python3
"""Tests of tools/tessera-launch, run as a process (python3 launch_test.py [Class.method])."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

LAUNCH = os.environ.get("TESSERA_LAUNCH",
                        os.path.join(os.path.dirname(__file__), "..", "..", "tools", "tessera-launch"))


def launch(args, timeout=60, env=None, **kw):
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL", "TESSERA_LAUNCH_")):
            del e[k]
    e.update(env or {})
    return subprocess.run([sys.executable, LAUNCH] + args, capture_output=True, text=True, timeout=timeout, env=e, **kw)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Env(unittest.TestCase):
    def test_torchrun_variables(self):
        r = launch(["--nproc-per-node", "3", "--master-port", "29777", "--job", "jobA", "--",
                    "sh", "-c", "echo ENV $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $TESSERA_STORE_PORT "
                    "$MASTER_PORT $TESSERA_JOB"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(l for l in r.stdout.splitlines() if "ENV" in l)
        # tessera's store on the given port, MASTER_PORT above it for torch.distributed's env:// store.
        self.assertEqual(lines, [f"[rank{i}]: ENV {i} {i} 3 3 127.0.0.1 29777 29778 jobA" for i in range(3)])

    def test_store_secret_in_the_environment_only(self):
        # Every rank of a job gets the same fresh secret, in its environment and nowhere on a
        # command line; a caller's own secret (two jobs that must meet) is passed through.
        show = "echo SECRET=$TESSERA_STORE_SECRET; echo CMDLINE=$(tr '\\0' ' ' < /proc/$PPID/cmdline)"
        env = {"TESSERA_STORE_SECRET": ""}
        r = launch(["--nproc-per-node", "2", "--master-port", "29778", "--", "sh", "-c", show], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        secrets = {l.split("SECRET=")[1] for l in r.stdout.splitlines() if "]: SECRET=" in l}
        self.assertEqual(len(secrets), 1, r.stdout)
        secret = secrets.pop()
        self.assertEqual(len(secret), 64)
        cmdlines = [l for l in r.stdout.splitlines() if "]: CMDLINE=" in l]
        self.assertEqual(len(cmdlines), 2, r.stdout)
        for line in cmdlines:
            self.assertNotIn(secret, line)
        r2 = launch(["--nproc-per-node", "1", "--master-port", "29779", "--", "sh", "-c", show], env=env)
        self.assertNotIn(secret, r2.stdout)  # a fresh secret per job
        r3 = launch(["--nproc-per-node", "1", "--master-port", "29780", "--", "sh", "-c",
                     "echo GIVEN $TESSERA_STORE_SECRET"], env={"TESSERA_STORE_SECRET": "shared-by-both-jobs"})
        self.assertIn("GIVEN shared-by-both-jobs", r3.stdout)
        dry = launch(["--nproc-per-node", "2", "--dry-run", "prog"], env={"TESSERA_STORE_SECRET": "s3cr3t"})
        self.assertNotIn("s3cr3t", dry.stdout + dry.stderr)

    def test_thread_variables(self):
        # The node's cores split over its ranks, unless the caller set them (OpenBLAS keeps its
        # own pool, which set_num_threads does not reach).
        e = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        r = subprocess.run([sys.executable, LAUNCH, "--nproc-per-node", "2", "--dry-run", "prog"],
                           capture_output=True, text=True, timeout=60, env=e)
        share = max(1, (os.cpu_count() or 1) // 2)
        self.assertEqual(r.stdout.count(f"OMP_NUM_THREADS={share} OPENBLAS_NUM_THREADS={share}"), 2, r.stdout)
        r = launch(["--nproc-per-node", "2", "--dry-run", "prog"], env={"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "5"})
        self.assertNotIn("OMP_NUM_THREADS=", r.stdout)  # the caller's own values pass through untouched
        self.assertNotIn("OPENBLAS_NUM_THREADS=", r.stdout)

    def test_bind_cores_to_rank(self):
        # Each rank bound to its own share of the launcher's CPUs before exec, OMP_NUM_THREADS its size.
        allowed = sorted(os.sched_getaffinity(0))
        show = "echo BIND $RANK $OMP_NUM_THREADS $TESSERA_CPU_LIST $(grep Cpus_allowed_list /proc/self/status | cut -f2)"
        env = {"OMP_NUM_THREADS": "", "OPENBLAS_NUM_THREADS": ""}
        e = {k: v for k, v in os.environ.items() if k not in env}
        if len(allowed) >= 2:
            r = subprocess.run([sys.executable, LAUNCH, "--nproc-per-node", "2", "--master-port", "29779",
                                "--bind-cores-to-rank", "--", "sh", "-c", show], capture_output=True, text=True,
                               timeout=60, env=e)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = sorted(l.split("BIND ")[1].split() for l in r.stdout.splitlines() if "BIND" in l)
            self.assertEqual([l[0] for l in lines], ["0", "1"], r.stdout)
            sets = []
            for rank, threads, listed, bound in lines:
                cpus = set()
                for part in bound.split(","):  # the kernel's own list: ranges like 0-3
                    lo, _, hi = part.partition("-")
                    cpus.update(range(int(lo), int(hi or lo) + 1))
                self.assertEqual(sorted(cpus), [int(c) for c in listed.split(",")], r.stdout)
                self.assertEqual(int(threads), len(cpus), r.stdout)
                sets.append(cpus)
            self.assertFalse(sets[0] & sets[1], r.stdout)
            self.assertTrue((sets[0] | sets[1]) <= set(allowed), r.stdout)
        r = launch(["--nproc-per-node", "1", "--bind-cores-to-rank", "--bind-core-list", str(allowed[-1]), "--",
                    "sh", "-c", show])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"BIND 0 ", r.stdout)
        self.assertIn(f" {allowed[-1]} {allowed[-1]}", r.stdout)
        # More ranks than cores, CPUs the launcher may not use, a bad list, a list without the flag.
        r = launch(["--nproc-per-node", str(len(allowed) + 1), "--bind-cores-to-rank", "--", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{len(allowed) + 1} ranks on this node but", r.stderr)
        r = launch(["--nproc-per-node", "1", "--bind-cores-to-rank", "--bind-core-list", f"{max(allowed) + 1}", "--", "true"])
        self.assertIn("are not available to this launcher", r.stderr)
        r = launch(["--nproc-per-node", "1", "--bind-cores-to-rank", "--bind-core-list", "3-1", "--", "true"])
        self.assertIn("'3-1' is not a range of CPU numbers", r.stderr)
        r = launch(["--nproc-per-node", "1", "--bind-core-list", "0", "--", "true"])
        self.assertIn("--bind-core-list needs --bind-cores-to-rank", r.stderr)
        r = launch(["--nproc-per-node", "1", "--launcher", "openmpi", "--bind-cores-to-rank", "--dry-run", "prog"])
        self.assertIn("use its own binding", r.stderr)

    def test_multi_node_ranks(self):
        # Node 1 of 2 with 2 ranks per node holds global ranks 2 and 3.
        r = launch(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "10.1.2.3",
                    "sh", "-c", "echo ENV $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(l for l in r.stdout.splitlines() if "ENV" in l)
        self.assertEqual(lines, ["[rank2]: ENV 2 0 4 2 10.1.2.3", "[rank3]: ENV 3 1 4 2 10.1.2.3"])

    def test_slurm_mapping(self):
        r = launch(["--dry-run", "--job", "s", "prog"], env={
            "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
            "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_NODELIST": "node[07-10]"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("started by slurm: RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 "
                      "MASTER_ADDR=node07 TESSERA_STORE_PORT=29500 MASTER_PORT=29501 TESSERA_JOB=s prog", r.stdout)

    def test_mpirun_mapping_execs_program(self):
        r = launch(["sh", "-c", "echo ENV $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE"], env={
            "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "ENV 3 4 1 2")  # exec'd: no prefix, no spawning


class Output(unittest.TestCase):
    def test_every_line_prefixed(self):
        r = launch(["--nproc-per-node", "2", "sh", "-c",
                    "for i in 1 2 3; do echo out$i; echo err$i >&2; done; printf tail"])
        self.assertEqual(r.returncode, 0, r.stderr)
        for stream in (r.stdout, r.stderr):
            lines = stream.splitlines()
            self.assertTrue(lines)
            for line in lines:
                self.assertRegex(line, r"^\[rank[01]\]: ")
        for rank in (0, 1):
            got = [l for l in r.stdout.splitlines() if l.startswith(f"[rank{rank}]")]
            self.assertEqual(got, [f"[rank{rank}]: out1", f"[rank{rank}]: out2", f"[rank{rank}]: out3",
                                   f"[rank{rank}]: tail"])


class Failure(unittest.TestCase):
    def test_rank_exit_status_propagates(self):
        t0 = time.monotonic()
        r = launch(["--nproc-per-node", "3", "sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 60'])
        self.assertEqual(r.returncode, 3)
        self.assertLess(time.monotonic() - t0, 30)
        msgs = [l for l in r.stderr.splitlines() if l.startswith("tessera-launch:")]
        self.assertEqual(len(msgs), 1, r.stderr)
        self.assertIn("rank 1", msgs[0])
        self.assertIn("exited with status 3", msgs[0])

    def test_sigkilled_rank_ends_the_job(self):
        with tempfile.TemporaryDirectory() as d:
            script = ('echo $$ > %s/pid.$RANK; if [ "$RANK" = 2 ]; then sleep 0.5; kill -KILL $$; fi; '
                      'trap "" TERM; exec sleep 120' % d)  # ranks ignore SIGTERM: SIGKILL must follow
            t0 = time.monotonic()
            r = launch(["--nproc-per-node", "4", "--grace-period", "2", "sh", "-c", script], timeout=60)
            elapsed = time.monotonic() - t0
            self.assertEqual(r.returncode, 128 + 9, r.stderr)
            self.assertLess(elapsed, 10)
            self.assertIn("rank 2", r.stderr)
            self.assertIn("SIGKILL", r.stderr)
            for rank in range(4):
                with open(f"{d}/pid.{rank}") as f:
                    pid = int(f.read())
                self.assertFalse(alive(pid), f"rank {rank} (pid {pid}) still alive")

    def test_sigterm_is_forwarded(self):
        with tempfile.TemporaryDirectory() as d:
            script = 'trap "echo got-term; exit 0" TERM; touch %s/up.$RANK; sleep 60 & wait' % d
            p = subprocess.Popen([sys.executable, LAUNCH, "--nproc-per-node", "2", "sh", "-c", script],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(200):
                if all(os.path.exists(f"{d}/up.{i}") for i in range(2)):
                    break
                time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
            self.assertEqual(sorted(l for l in out.splitlines() if "got-term" in l),
                             ["[rank0]: got-term", "[rank1]: got-term"])
            self.assertEqual(p.returncode, 128 + signal.SIGTERM)  # interrupted, though ranks exited 0
            self.assertIn("forwarded SIGTERM", err)


class Hostfile(unittest.TestCase):
    def hostfile(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    HOSTS = "# cluster\nworker-0 slots=4\nworker-1 slots=4   # spare\n\nworker-2 slots=2\n"

    def test_include(self):
        hf = self.hostfile(self.HOSTS)
        r = launch(["--hostfile", hf, "--include", "worker-0:1,3@worker-2", "--launcher", "ssh", "--dry-run", "prog"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("host worker-0: ranks 0..1 slots 1,3", r.stdout)
        self.assertIn("host worker-2: ranks 2..3 slots 0,1", r.stdout)
        self.assertNotIn("worker-1", r.stdout.replace("worker-1 slots", ""))
        ssh = [l for l in r.stdout.splitlines() if "'ssh'" in l or " ssh " in l]
        self.assertEqual(len(ssh), 2, r.stdout)
        self.assertIn("worker-0", ssh[0])
        self.assertIn("--master-addr worker-0", ssh[0])

    def test_exclude(self):
        hf = self.hostfile(self.HOSTS)
        r = launch(["--hostfile", hf, "--exclude", "worker-1@worker-0:0", "--launcher", "ssh", "--dry-run", "prog"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("host worker-0: ranks 0..2 slots 1,2,3", r.stdout)
        self.assertIn("host worker-2: ranks 3..4 slots 0,1", r.stdout)
        self.assertNotIn("host worker-1", r.stdout)

    def test_local_host_slots(self):
        hf = self.hostfile("localhost slots=4\n")
        r = launch(["--hostfile", hf, "--include", "localhost:1,2", "--dry-run", "prog", "x"])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 2)
        self.assertIn("RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2", lines[0])
        self.assertIn("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2", lines[1])
        self.assertIn("CUDA_VISIBLE_DEVICES=1,2", lines[0])
        self.assertTrue(lines[0].endswith("prog x"))

    def test_bad_filters(self):
        hf = self.hostfile(self.HOSTS)
        for args in (["--include", "nohost"], ["--include", "worker-2:5"], ["--include", "worker-0", "--exclude", "worker-1"]):
            r = launch(["--hostfile", hf] + args + ["--dry-run", "prog"])
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("error", r.stderr)


if __name__ == "__main__":
    unittest.main()
