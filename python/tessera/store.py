"""The store tessera-launch's jobs meet in, for small messages between processes and jobs (the C++ examples pass
prompts and samples through it): values are bytes; get() blocks until the key exists, within a timeout (a
tessera.TimeoutError naming the key).

    shared = tessera.store.shared("grpo")       # keys every job meeting in this store sees
    shared.set("step0/prompts", b"...")
    samples = shared.get("step0/samples", timeout_ms=300000)
"""
from . import _tessera


def job():
    """This job's own keys."""
    return _tessera.job_store()


def shared(name):
    """A namespace every job meeting in this store shares (the jobs' store secret must match)."""
    return _tessera.shared_store(name)
