#!/usr/bin/env python3
"""test_gpu_spec.py: speculative decoding on the GPU. test_spec.py and
test_spec_edges.py run again with residentd on CUDA in exact mode
(RESIDENT_E2E_DEVICE=cuda: --device cuda --exact), so every check of theirs
holds there too: greedy output with lookup guesses and with draft models the
same as without, streamed and not, stop strings and max_tokens inside
accepted runs, the context's end, cancels and hang-ups mid-round, sessions
resumed from disk, several choices, grammars, the memory budget; each
checks that its daemon's models run on the GPU.

Exact mode, since the default numerics compute a step of several tokens
with other kernels than a step of one (tests/bench/spec_bench.py measures
how far outputs part there, on a real model). Skips (77) without a GPU.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks  # noqa: E402

TESTS = ("test_spec.py", "test_spec_edges.py")


def main():
    rsd.require_gpu()
    ck = Checks()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in TESTS:
        with ck.section(name + " on the GPU"):
            r = subprocess.run([sys.executable, os.path.join(here, name)], timeout=1800,
                               env=dict(os.environ, RESIDENT_E2E_DEVICE="cuda"))
            if r.returncode == rsd.SKIP:
                raise rsd.Skip("%s skipped on the GPU (its output says why)" % name)
            ck.eq(r.returncode, 0, "%s passes with residentd on CUDA, exact" % name)
    return ck


if __name__ == "__main__":
    rsd.main(main)
