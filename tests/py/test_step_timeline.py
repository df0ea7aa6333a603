"""tests/bench/step-timeline.py on ncu CSVs written here: the decode steps of
the batch asked for (the first two left out) grouped by kernel and grid, with
their times, bytes and shares, in nanoseconds and microseconds alike; a clear
message, not a traceback, for a CSV of no kernels or of no step of that batch."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, srcdir  # noqa: E402

SCRIPT = os.path.join(srcdir(), "tests", "bench", "step-timeline.py")
HEAD = '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","launch__grid_size"'


def csv_of(kernels, tunit="usecond", bunit="byte"):
    """An ncu --csv --page raw file of (name, grid, time, bytes), after ncu's own lines."""
    lines = ["==PROF== Connected to process 1", HEAD, f'"","","{tunit}","{bunit}",""']
    for i, (name, grid, t, b) in enumerate(kernels):
        lines.append(f'"{i}","{name}","{t:,}","{b:,}","{grid:,}"')
    return "\n".join(lines) + "\n"


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def step(batch, scale=1.0):
    """One decode step: the gather, a product twice, a norm (us, bytes)."""
    return [("void embed_kernel<12>(const unsigned char *, int)", batch, 2.0 * scale, 1000),
            ("void qw_kernel<12, qw_cfg<64>>(CUtensorMap_st, qg_args)", 224, 50.0 * scale, 66_000_000),
            ("void qw_kernel<12, qw_cfg<64>>(CUtensorMap_st, qg_args)", 224, 50.0 * scale, 66_000_000),
            ("void residual_norm_kernel<2>(float *, const float *)", batch, 8.0 * scale, 4_000_000)]


def main():
    ck = Checks()
    # two warm-up steps of another size, then three of 64 tokens, then a fourth gather that ends them
    ks = step(1, 10) + step(1, 10) + step(64) + step(64) + step(64) + step(64)[:1]
    r = run(csv_of(ks), "64")
    ck(r.returncode == 0, f"a CSV of 64-token steps reads (rc {r.returncode}, {r.stderr.strip()})")
    out = r.stdout
    # the first two 64-token steps are warm-up too: one step is left
    ck("1 decode steps; kernel time a step 110.0 us" in out, "the steps counted and timed:\n" + out)
    ck("| qw_kernel<12, qw_cfg<64>> (224) | 2 | 100.0 | 132.0 | 1.32 | 90.9 % |" in out,
       "a kernel's calls, time, bytes, rate and share")
    ck(out.index("qw_kernel") < out.index("residual_norm_kernel<2>"), "the longest first")

    # the same in nanoseconds and kilobytes
    ns = [(n, g, t * 1000, b / 1000) for n, g, t, b in ks]
    r = run(csv_of(ns, "nsecond", "Kbyte"), "64")
    ck(r.returncode == 0 and "kernel time a step 110.0 us" in r.stdout, "ncu's other units:\n" + r.stdout)

    r = run(csv_of(ks), "256")
    ck(r.returncode != 0 and "no complete decode step of 256 tokens" in r.stderr and "1, 64 tokens" in r.stderr
       and "Traceback" not in r.stderr, "no step of the batch asked for: " + r.stderr.strip())

    r = run("==PROF== Connected to process 1\n==ERROR== the application exited early\n")
    ck(r.returncode != 0 and "no kernels" in r.stderr and "Traceback" not in r.stderr,
       "a CSV of no kernels: " + r.stderr.strip())
    ck.finish()


if __name__ == "__main__":
    main()
