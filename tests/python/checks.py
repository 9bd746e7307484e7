"""The Python tests' checks: every failed expectation is printed at once (naming this process) and counted, so a
test reports all it found; finish() exits non-zero when anything failed, else prints the test's ok line, which
ctest looks for."""
import sys


class Checks:
    def __init__(self, who):
        self.who, self.failures = who, []

    def expect(self, cond, what):
        if not cond:
            self.failures.append(what)
            print(f"{self.who}: FAILED: {what}", flush=True)

    def expect_error(self, cls, words, call):
        """call() must raise `cls` (or a subclass) whose message holds every one of `words`."""
        try:
            call()
        except cls as e:
            self.expect(all(w in str(e) for w in words), f"{cls.__name__} without {words}: {e}")
            return
        except Exception as e:  # noqa: BLE001
            self.expect(False, f"expected {cls.__name__} with {words}, got {type(e).__name__}: {e}")
            return
        self.expect(False, f"expected {cls.__name__} with {words}: nothing raised")

    def finish(self, ok_line):
        if self.failures:
            sys.exit(f"{self.who}: {len(self.failures)} failure(s)")
        print(f"{self.who}: {ok_line}", flush=True)
