"""Helpers shared by the Python tests, which automake runs with
RESIDENT_BUILDDIR and RESIDENT_SRCDIR set (exit 0 pass, 77 skip, else fail)."""
import os
import sys

SKIP = 77


def skip(msg):
    """Ends the test as skipped, saying why."""
    print(f"SKIP: {msg}")
    sys.exit(SKIP)


def fail(msg):
    """Ends the test as failed, saying why."""
    print(f"FAIL: {msg}")
    sys.exit(1)


def builddir():
    """Where the binaries were built: $RESIDENT_BUILDDIR, else the current dir."""
    return os.environ.get("RESIDENT_BUILDDIR") or os.getcwd()


def srcdir():
    """The source tree: $RESIDENT_SRCDIR, else the one holding tests/py."""
    return os.environ.get("RESIDENT_SRCDIR") or \
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary(name):
    """Path of a built program. A missing one is a failed build, not a skip."""
    path = os.path.join(builddir(), name)
    if not os.access(path, os.X_OK):
        fail(f"{path} not found or not executable (build it first, or set RESIDENT_BUILDDIR)")
    return path


class Checks:
    """Named checks that go on after a failure: check(ok, what) prints the
    result and returns ok; finish() fails the test if any check failed."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    def finish(self):
        if self.failures:
            fail(f"{len(self.failures)} check(s) failed, first: {self.failures[0]}")
