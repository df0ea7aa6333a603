#!/bin/sh
# device-check.sh: what `make check-cuda` and the benchmark check, on a GPU
# machine that cannot build (the lent ones have no autotools or -dev
# packages): every kernel and whole models against the CPU backend
# (test_cuda_ops, test_cuda), logits against transformers (test_hf.py),
# the daemon on the GPU and on the CPU (test_gpu_cpu.py), compute-
# sanitizer's memcheck over both C tests, then resident-bench on a generated
# llama3-8b Q4_K_M. Logs go to OUTDIR; a short summary is printed last.
#
#   kernels/cuda/device-check.sh BINDIR OUTDIR
#
# Run from the source tree (the Python tests are read from it). BINDIR holds
# residentd, resident-model, resident-bench, test_cuda and test_cuda_ops,
# and in BINDIR/lib the shared libraries the GPU machine lacks. Built here:
#
#   CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" ../configure && make &&
#   make tests/unit/test_cuda tests/unit/test_cuda_ops
#   mkdir -p ../.carry/b/lib && cp residentd resident-model resident-bench \
#     tests/unit/test_cuda tests/unit/test_cuda_ops ../.carry/b &&
#   cp -L $(ldd residentd tests/unit/test_cuda | grep -oE '/[^ ]*lib(cmocka|jansson|pcre2-8|event[a-z_]*-2[^ ]*|msgpackc|sqlite3)\.so[^ ]*' | sort -u) ../.carry/b/lib
#
# and this runs with .carry/b carried. The real Gemma 3 270M (253 MB) is
# more than one call carries: split it into pieces of 50 MB, carry one per
# call and copy it to /tmp while the machine stays warm, join them in the
# last call and name the file in RESIDENT_GEMMA (test_cuda and
# test_gpu_cpu.py use it; without it they say what they skipped).
# DEVICE_CHECK_BENCH=0 skips the benchmark (about 5 minutes on an H100).
set -u
bin=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RESIDENT_BUILDDIR="$bin" PYTHONUNBUFFERED=1

# run NAME SECONDS COMMAND...: the command's output in OUTDIR/NAME.log, its status and time printed
run() {
	n=$1
	shift
	t0=$(date +%s)
	timeout "$@" > "$out/$n.log" 2>&1
	echo "$n rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$out/summary.txt"
}

: > "$out/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
run test_cuda_ops 150 "$bin/test_cuda_ops"
run test_cuda 300 "$bin/test_cuda"
run test_hf 300 python3 tests/cuda/test_hf.py
run test_gpu_cpu 300 python3 tests/e2e/test_gpu_cpu.py
run memcheck_ops 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_ops"
run memcheck_cuda 600 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda"

if [ "${DEVICE_CHECK_BENCH:-1}" != 0 ]; then
	[ -f /tmp/l8.gguf ] || run gen 300 "$bin/resident-model" gen llama3-8b /tmp/l8.gguf --type q4_k_m --quiet
	run bench 300 "$bin/resident-bench" -m /tmp/l8.gguf --device cuda -p 512,4096 -n 128 -b 1,4,16,32,64 -r 3
	run bench_depth 300 "$bin/resident-bench" -m /tmp/l8.gguf --device cuda -p '' -n 128 -b 1 \
	    -d 4096,16384 -r 2
fi

echo "== summary"
grep -hE 'max error|max relative|worst' "$out/test_cuda_ops.log" "$out/test_cuda.log"
grep -hE 'cuda|^PASS|^FAIL|SKIP' "$out/test_hf.log" "$out/test_gpu_cpu.log" | tail -n 14
grep -hE 'ERROR SUMMARY' "$out/memcheck_ops.log" "$out/memcheck_cuda.log"
cat "$out/summary.txt"
[ -f "$out/bench.log" ] && cat "$out/bench.log" && tail -n 2 "$out/bench_depth.log"
exit 0
