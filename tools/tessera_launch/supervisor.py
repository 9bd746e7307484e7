"""Local supervision: one process per rank, prefixed output, signal forwarding, failure and liveness."""
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from .common import PROG, die, signal_name


class Heartbeats:
    """Each rank's heartbeat socket (transport/liveness.h): the rank beats a line a second from a
    dedicated thread, saying which collectives it has been waiting in; a rank that has beaten
    and falls silent for `timeout_s` is reported. Ranks that never beat (programs that do not use
    tessera's transport) are not watched."""

    def __init__(self, timeout_s):
        self.timeout_s = timeout_s
        self.selector = selectors.DefaultSelector()
        self.last = {}      # rank -> time of the last beat
        self.waiting = {}   # rank -> what its last beat said it waits in
        self.partial = {}

    def add(self, rank, sock):
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, rank)
        self.partial[rank] = b""

    def poll(self, timeout):
        for key, _ in self.selector.select(timeout):
            rank, sock = key.data, key.fileobj
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:  # the rank exited (or closed it): nothing more to watch
                self.selector.unregister(sock)
                sock.close()
                self.last.pop(rank, None)
                continue
            lines = (self.partial[rank] + data).split(b"\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                if line.startswith(b"beat"):
                    self.last[rank] = time.monotonic()
                    self.waiting[rank] = line[4:].strip().decode(errors="replace")

    def silent(self, running):
        """(rank, seconds) of a running rank that stopped beating, or None."""
        now = time.monotonic()
        for rank in sorted(self.last):
            if rank in running and now - self.last[rank] > self.timeout_s:
                return rank, now - self.last[rank]
        return None

    def others_waiting(self, silent_rank):
        parts = [f"rank {r}: {w}" for r, w in sorted(self.waiting.items()) if r != silent_rank and w]
        return "; ".join(parts) if parts else "no other rank reported waiting in a collective"


class Supervisor:
    def __init__(self, ranks, program, base_env, grace_s, prefix, heartbeat_timeout_s=8.0):
        self.ranks = ranks  # [(global_rank, local_rank, extra_env)]
        self.program = program
        self.base_env = base_env
        self.grace_s = grace_s
        self.prefix = prefix
        self.procs = {}
        self.out_lock = threading.Lock()
        self.readers = []
        self.stop_signal = None
        self.heartbeats = Heartbeats(heartbeat_timeout_s) if heartbeat_timeout_s > 0 else None

    def start(self):
        for rank, local_rank, extra in self.ranks:
            env = dict(self.base_env)
            env.update(extra)
            pipe = subprocess.PIPE if self.prefix else None
            fds = ()
            if self.heartbeats:
                ours, theirs = socket.socketpair()
                env["TESSERA_HEARTBEAT_FD"] = str(theirs.fileno())
                fds = (theirs.fileno(),)
            cpus = [int(c) for c in extra["TESSERA_CPU_LIST"].split(",")] if extra.get("TESSERA_CPU_LIST") else None
            try:
                # Bound before exec (--bind-cores-to-rank): every thread the program starts inherits it.
                p = subprocess.Popen(self.program, env=env, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL,
                                     start_new_session=True, pass_fds=fds,
                                     preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None)
            except OSError as e:
                self.kill_all(signal.SIGKILL)
                die(f"cannot start rank {rank}: {self.program[0]}: {e.strerror}", 127)
            if self.heartbeats:
                theirs.close()
                self.heartbeats.add(rank, ours)
            self.procs[rank] = p
            if self.prefix:
                for stream, sink in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                    t = threading.Thread(target=self.pump, args=(rank, stream, sink), daemon=True)
                    t.start()
                    self.readers.append(t)

    def pump(self, rank, stream, sink):
        tag = f"[rank{rank}]: ".encode()
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self.out_lock:
                sink.write(tag + line)
                sink.flush()
        stream.close()

    def send_all(self, signum):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def kill_all(self, signum):
        self.send_all(signum)

    def end_others(self):
        self.send_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        if any(p.poll() is None for p in self.procs.values()):
            self.send_all(signal.SIGKILL)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # Grandchildren that outlive a rank are ended with its process group.
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(self, signum, _frame):
        self.stop_signal = signum
        self.send_all(signum)

    def run(self):
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        self.start()
        failed = None
        silent = None
        forwarded_at = None
        while True:
            running = set()
            for rank in sorted(self.procs):
                code = self.procs[rank].poll()
                if code is None:
                    running.add(rank)
                elif code != 0 and failed is None:
                    failed = (rank, code)
            if failed is not None or not running:
                break
            if self.heartbeats and self.stop_signal is None:
                silent = self.heartbeats.silent(running)
                if silent is not None:
                    break
            if self.stop_signal is not None:
                if forwarded_at is None:
                    forwarded_at = time.monotonic()
                elif time.monotonic() - forwarded_at > self.grace_s:
                    self.send_all(signal.SIGKILL)
            if self.heartbeats:
                self.heartbeats.poll(0.05)
            else:
                time.sleep(0.05)
        if silent is not None:
            rank, seconds = silent
            waits = self.heartbeats.others_waiting(rank)
            # SIGTERM first (a stopped process gets it when continued), SIGKILL after the grace period.
            self.end_others()
            for t in self.readers:
                t.join(timeout=5)
            sys.stderr.write(f"{PROG}: rank {rank} (pid {self.procs[rank].pid}) stopped beating {seconds:.1f} s ago "
                             f"(stopped, or it cannot run); ended the job. Waiting: {waits}\n")
            sys.stderr.flush()
            return 75
        if failed is not None:
            rank, code = failed
            self.end_others()
        for t in self.readers:
            t.join(timeout=5)
        if failed is None:
            if self.stop_signal is not None:
                # Interrupted: even if every rank ended cleanly, the job did not run to its end.
                sys.stderr.write(f"{PROG}: forwarded {signal_name(self.stop_signal)} to every rank; all ended\n")
                return 128 + self.stop_signal
            return 0
        rank, code = failed
        pid = self.procs[rank].pid
        if code < 0:
            status = 128 - code
            what = f"was killed by {signal_name(-code)}"
        else:
            status = code
            what = f"exited with status {code}"
        cause = " after the launcher forwarded " + signal_name(self.stop_signal) if self.stop_signal else ""
        sys.stderr.write(f"{PROG}: rank {rank} (pid {pid}) {what}{cause}; ended the other ranks\n")
        sys.stderr.flush()
        return status


# ------------------------------------------------------------------------------------------------
