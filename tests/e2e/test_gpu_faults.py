#!/usr/bin/env python3
"""test_gpu_faults.py: test_faults.py's scenarios on a GPU, with RESIDENT_CUDA_FAULT.

  - a failed kernel launch, and a failed copy, in the middle of serving:
    the requests get model_error naming the call, the model is loaded again
    on the GPU and gives the same greedy replies as before (--exact, so
    that no cuBLAS algorithm choice can differ);
  - a failed launch under --device-fault cpu: the model goes on on the CPU;
  - launches failing from the 3rd on: every request says so, the daemon
    answers and counts them;
  - the first allocation failing: the model cannot load, the daemon says
    so at start.

Skips (77) without a GPU (nvidia-smi -L) or when residentd has no CUDA
backend. On a GPU machine, from a build configured with CUDA:
    make check TESTS=tests/e2e/test_gpu_faults.py
or  RESIDENT_BUILDDIR=$PWD python3 ../../tests/e2e/test_gpu_faults.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402
from test_faults import persistent, refused, scenario  # noqa: E402


def require_cuda_daemon():
    """Skips unless residentd can load a model on the GPU."""
    rsd.require_gpu()
    d = Daemon(extra=["--device", "cuda"])
    try:
        d.start(timeout=300)
        d.stop()
    except AssertionError:
        if "no CUDA backend" in d.log_text():
            raise Skip("residentd was built without the CUDA backend")
        raise
    finally:
        d.cleanup()


def main():
    require_cuda_daemon()
    ck = Checks()
    exact = ["--exact"]
    scenario(ck, "cuda launch fault, reload", "cuda", {"RESIDENT_CUDA_FAULT": "launch:400"}, "reload", "cuda", exact)
    scenario(ck, "cuda copy fault, reload", "cuda", {"RESIDENT_CUDA_FAULT": "copy:100"}, "reload", "cuda", exact)
    scenario(ck, "cuda launch fault, --device-fault cpu", "cuda", {"RESIDENT_CUDA_FAULT": "launch:400"}, "cpu",
             "cpu", exact)
    persistent(ck, "cuda launch faults from the 3rd on", "cuda", {"RESIDENT_CUDA_FAULT": "launch:3+"}, 3)
    refused(ck, "cuda: the first allocation fails", {"RESIDENT_CUDA_FAULT": "alloc:1"}, "fault injected")
    refused(ck, "a malformed RESIDENT_CUDA_FAULT", {"RESIDENT_CUDA_FAULT": "step:1"}, "RESIDENT_CUDA_FAULT")
    return ck


if __name__ == "__main__":
    rsd.main(main)
