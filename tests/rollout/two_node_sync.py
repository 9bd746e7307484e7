#!/usr/bin/env python3
"""Training -> rollout weight sync across "nodes": Linux network namespaces with no loopback in
common, so the bytes cross a real network interface over UCX's TCP transport.

Usage: two_node_sync.py LAUNCH PORT -- PROGRAM [ARGS...]     (as root; a failure, never a skip)

Topology, created here and always removed (also on SIGTERM):
    tsr_train_<pid>     bridge tsr0 10.231.0.1/24: the training job (DP 2, one node launcher),
                        hosting the store there (MASTER_ADDR=10.231.0.1)
    tsr_rollout<k>_<pid>  veth tsr0 10.231.0.<2+k>/24, its peer a port of the bridge: rollout rank
                        k, started by its own node launcher (--nnodes 2 --node-rank k), joining the
                        training job's store with the same secret
Both jobs run UCX on TCP only over tsr0 (shared memory would bypass the link: namespaces share
memory); the rollout TP pair's Gloo finds its address from MASTER_ADDR's route (the default),
the training job's from GLOO_SOCKET_IFNAME. Passes when every launcher exits 0 within 150 s
and each rollout namespace's tsr0 received at least the bytes its rank says UCX delivered.
The port and addresses live in these namespaces only, so runs in parallel never meet.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

launch, port = sys.argv[1:3]
program = sys.argv[4:] if sys.argv[3] == "--" else sys.argv[3:]

LINK = "tsr0"  # the same name in every namespace, so one UCX_NET_DEVICES fits all
SUBNET = "10.231.0"  # inside our own namespaces only: it cannot meet the host's networks
TRAIN_ADDR = f"{SUBNET}.1"
ROLLOUT_RANKS = 2
PID = os.getpid()
TRAIN_NS = f"tsr_train_{PID}"
ROLLOUT_NS = [f"tsr_rollout{k}_{PID}" for k in range(ROLLOUT_RANKS)]


def fail(message):
    print(f"two_node_sync: FAILED: {message}", flush=True)
    sys.exit(1)


def ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {r.stderr.strip()}")
    return r.stdout


def remove_stale_namespaces():
    """Namespaces of earlier runs that were killed before their cleanup (their pid is gone)."""
    for line in ip("netns", "list").splitlines():
        m = re.match(r"(tsr_(?:train|rollout\d+)_(\d+))\b", line)
        if m and int(m.group(2)) != PID and not os.path.exists(f"/proc/{m.group(2)}"):
            subprocess.run(["ip", "netns", "del", m.group(1)], capture_output=True)


def create_nodes():
    ip("netns", "add", TRAIN_NS)
    for ns in ROLLOUT_NS:
        ip("netns", "add", ns)
    ip("-n", TRAIN_NS, "link", "add", LINK, "type", "bridge", "forward_delay", "0")
    ip("-n", TRAIN_NS, "addr", "add", f"{TRAIN_ADDR}/24", "dev", LINK)
    for k, ns in enumerate(ROLLOUT_NS):
        port_name = f"tsr_port{k}"
        ip("-n", TRAIN_NS, "link", "add", port_name, "type", "veth", "peer", "name", LINK, "netns", ns)
        ip("-n", TRAIN_NS, "link", "set", port_name, "master", LINK, "up")
        ip("-n", ns, "addr", "add", f"{SUBNET}.{2 + k}/24", "dev", LINK)
        ip("-n", ns, "link", "set", LINK, "up")
        ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", TRAIN_NS, "link", "set", LINK, "up")
    ip("-n", TRAIN_NS, "link", "set", "lo", "up")


def wait_until_up():
    """The bridge reports carrier a few ms after its ports do; UCX ignores a link without it."""
    deadline = time.monotonic() + 10
    for ns in [TRAIN_NS] + ROLLOUT_NS:
        while "state UP" not in ip("-n", ns, "link", "show", LINK):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{LINK} in {ns} did not come up: {ip('-n', ns, 'link', 'show', LINK).strip()}")
            time.sleep(0.02)


def remove_nodes():
    # Deleting a namespace takes its veth ends and the bridge with it.
    existing = ip("netns", "list")
    for ns in [TRAIN_NS] + ROLLOUT_NS:
        if re.search(rf"^{ns}\b", existing, re.M):
            ip("netns", "del", ns)


def counter(ns, name):
    """tsr0's statistics counter `name` in namespace `ns` (ip netns exec mounts that namespace's sysfs)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{LINK}/statistics/{name}"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def start(ns, args, env):
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, launch, "--master-addr", TRAIN_ADDR,
                             "--master-port", port, "--grace-period", "2"] + args + ["--"] + program,
                            env=env, start_new_session=True)


def run_jobs(shared):
    secret = os.urandom(16).hex()  # the two jobs (and the rollout job's two node launchers) share it
    common = dict(os.environ, TESSERA_STORE_SECRET=secret, UCX_TLS="tcp,self", UCX_NET_DEVICES=LINK,
                  TWO_NODE_IFACE=LINK, TWO_NODE_DIR=shared, TWO_NODE_ROLLOUT_RANKS=str(ROLLOUT_RANKS))
    train_env = dict(common, TESSERA_UCX_ROLE="train", TESSERA_PEER_JOB="rollout", GLOO_SOCKET_IFNAME=LINK)
    rollout_env = dict(common, TESSERA_UCX_ROLE="rollout", TESSERA_PEER_JOB="train", TESSERA_STORE_SERVER="0")
    rollout_env.pop("GLOO_SOCKET_IFNAME", None)
    procs = {"train": start(TRAIN_NS, ["--nproc-per-node", "2", "--job", "train"], train_env)}
    time.sleep(0.3)
    for k, ns in enumerate(ROLLOUT_NS):
        procs[f"rollout node {k}"] = start(ns, ["--nnodes", str(ROLLOUT_RANKS), "--node-rank", str(k),
                                                "--nproc-per-node", "1", "--job", "rollout"], rollout_env)
    status = {}
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and len(status) < len(procs):
            for name, proc in procs.items():
                if name not in status and proc.poll() is not None:
                    status[name] = proc.returncode
                    if proc.returncode != 0:
                        deadline = min(deadline, time.monotonic() + 10)  # the others follow or are ended
            time.sleep(0.1)
    finally:
        for proc in procs.values():
            signal_group(proc, signal.SIGTERM)  # a launcher forwards it to its ranks
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                signal_group(proc, signal.SIGKILL)
                proc.wait()
    return status, list(procs)


def signal_group(proc, signum):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass


def on_sigterm(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup below must not be cut short
    sys.exit(128 + signal.SIGTERM)


def main():
    if os.geteuid() != 0:
        fail("needs root for network namespaces (ip netns); these machines and CI run it as root")
    signal.signal(signal.SIGTERM, on_sigterm)
    shared = tempfile.mkdtemp(prefix=f"tessera_two_node_{PID}_")
    t0 = time.monotonic()
    try:
        try:
            remove_stale_namespaces()
            create_nodes()
            wait_until_up()
        except (RuntimeError, OSError) as e:
            fail(f"cannot create the test's network namespaces: {e}")
        start_rx = {ns: counter(ns, "rx_bytes") for ns in ROLLOUT_NS}
        status, names = run_jobs(shared)
        print(f"two_node_sync: launchers {status} in {time.monotonic() - t0:.1f} s", flush=True)
        if status != {name: 0 for name in names}:
            fail("launchers " + ", ".join(f"{n}: {status.get(n, 'did not finish in 150 s')}" for n in names))
        for k, ns in enumerate(ROLLOUT_NS):
            grew = counter(ns, "rx_bytes") - start_rx[ns]
            try:
                with open(os.path.join(shared, f"rollout{k}.bytes")) as f:
                    delivered, grew_in_receive = (int(x) for x in f.read().split())
            except (OSError, ValueError) as e:
                fail(f"rollout rank {k} left no report: {e}")
            print(f"two_node_sync: rollout rank {k} ({ns}, {SUBNET}.{2 + k}): UCX delivered {delivered} bytes "
                  f"in its syncs; {LINK} received {grew_in_receive} bytes during them, {grew} in the whole run",
                  flush=True)
            if delivered <= 0 or grew < delivered:
                fail(f"{ns}: {LINK} received {grew} bytes, fewer than the {delivered} synced: not over the link")
        print("two_node_sync: passed", flush=True)
    finally:
        remove_nodes()
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
