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
    """Soft assertions: each check is recorded and the test goes on.
    ok(cond, what) (also check(cond, what)) returns cond; failures are
    printed, passes too unless quiet; finish() fails the test if any failed."""

    def __init__(self, quiet=False):
        self.failed = []
        self.n = 0
        self.quiet = quiet

    def ok(self, cond, what):
        self.n += 1
        if not cond:
            self.failed.append(what)
        if not cond or not self.quiet:
            print(f"{'ok  ' if cond else 'FAIL'} {what}", flush=True)
        return bool(cond)

    __call__ = ok

    def eq(self, got, want, what):
        return self.ok(got == want, "%s: got %r, want %r" % (what, got, want))

    def finish(self):
        if self.failed:
            fail(f"{len(self.failed)} check(s) failed, first: {self.failed[0]}")
