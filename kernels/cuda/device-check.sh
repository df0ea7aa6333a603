#!/bin/sh
# device-check.sh: the CUDA backend on a GPU machine in one go: the kernels
# one at a time and the whole models against the CPU backend (test_cuda_ops,
# test_cuda), the logits against Hugging Face transformers (test_hf.py, where
# torch and transformers are installed), compute-sanitizer's memcheck over
# both C tests, and resident-bench / cuda-step-bench on a generated llama3-1b
# Q4_K_M. Logs go to OUTDIR; a short table is printed last.
#
#   kernels/cuda/device-check.sh BINDIR OUTDIR
#
# Run from the source tree (test_hf.py and tests/py/common.py are read from
# it). BINDIR holds test_cuda, test_cuda_ops, resident-model, resident-bench
# and cuda-step-bench (copies from a build directory, with the shared
# libraries they need that the GPU machine may lack in BINDIR/lib). The lent
# GPU machines have no autotools or -dev packages, so the programs are built
# elsewhere:
#
#   CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" ../configure && make &&
#   make tests/unit/test_cuda tests/unit/test_cuda_ops kernels/cuda/cuda-step-bench
#   mkdir -p ../.carry/cuda/lib && cp tests/unit/test_cuda tests/unit/test_cuda_ops \
#     resident-model resident-bench kernels/cuda/cuda-step-bench ../.carry/cuda &&
#   cp $(ldd resident-model tests/unit/test_cuda | grep -oE '/[^ ]*lib(cmocka|jansson|pcre2-8)[^ ]*' | sort -u) \
#     ../.carry/cuda/lib
#
# and this runs with .carry/cuda carried: kernels/cuda/device-check.sh .carry/cuda "$OUT".
# MEMCHECK_ONLY picks test_cuda's models under memcheck (TEST_CUDA_ONLY's
# syntax; empty: all of them, which takes long); DEVICE_CHECK_BENCH=0 skips
# the benchmarks; TEST_CUDA_OPS_SEED repeats a kernel test run.
set -u
bin=$(cd "$1" && pwd)
out=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
cuda_lib=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
export LD_LIBRARY_PATH="$bin/lib:$cuda_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t=$(find "$bin" -maxdepth 3 -name test_cuda -type f | grep -v '/lib/' | head -n 1)
to=$(find "$bin" -maxdepth 3 -name test_cuda_ops -type f | grep -v '/lib/' | head -n 1)
rb="$bin/resident-bench"
rm=$(find "$bin" -maxdepth 1 -name resident-model -type f | head -n 1)
only=${MEMCHECK_ONLY-tiny-gemma3/q4_k_m,tiny-qwen2/f16,tiny/q8_0,tiny-qwen3/q4_k_m}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader |
	tee "$out/gpu.txt"
missing=$(ldd "$t" "$to" "$rb" "$rm" 2>&1 | grep 'not found' | sort -u)
[ -n "$missing" ] && echo "missing libraries: $missing"

echo "== test_cuda_ops"
start=$(date +%s)
"$to" > "$out/test_cuda_ops.log" 2>&1
ops_rc=$?
grep -E 'seed|max |PASSED|FAILED|SKIP|ERROR|error' "$out/test_cuda_ops.log" | head -60
echo "test_cuda_ops rc=$ops_rc ($(( $(date +%s) - start )) s)"

echo "== test_cuda"
start=$(date +%s)
"$t" > "$out/test_cuda.log" 2>&1
test_rc=$?
grep -E 'max relative|PASSED|FAILED|SKIP|ERROR|error' "$out/test_cuda.log" | head -40
echo "test_cuda rc=$test_rc ($(( $(date +%s) - start )) s)"

echo "== test_hf.py"
start=$(date +%s)
RESIDENT_BUILDDIR="$bin" RESIDENT_SRCDIR="$src" timeout 400 python3 "$src/tests/cuda/test_hf.py" \
	> "$out/test_hf.log" 2>&1
hf_rc=$?
grep -E '^(ok|FAIL|SKIP|PASS)|done in|Error' "$out/test_hf.log" | head -40
echo "test_hf.py rc=$hf_rc ($(( $(date +%s) - start )) s)"

echo "== compute-sanitizer memcheck"
start=$(date +%s)
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$to" > "$out/memcheck_ops.log" 2>&1
san_ops_rc=$?
grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' "$out/memcheck_ops.log" | head -20
echo "memcheck test_cuda_ops rc=$san_ops_rc ($(( $(date +%s) - start )) s)"
start=$(date +%s)
TEST_CUDA_ONLY="$only" timeout 300 \
	compute-sanitizer --tool memcheck --error-exitcode 9 "$t" > "$out/memcheck.log" 2>&1
san_rc=$?
grep -E 'ERROR SUMMARY|Invalid|max relative|PASSED|FAILED' "$out/memcheck.log" | head -20
echo "memcheck test_cuda rc=$san_rc ($(( $(date +%s) - start )) s)"

if [ "${DEVICE_CHECK_BENCH:-1}" = 0 ]; then
	echo "== summary"
	cat "$out/gpu.txt"
	echo "test_cuda_ops rc=$ops_rc, test_cuda rc=$test_rc, test_hf.py rc=$hf_rc," \
	    "memcheck rc=$san_ops_rc/$san_rc"
	grep -E 'ERROR SUMMARY' "$out/memcheck_ops.log" "$out/memcheck.log"
	exit 0
fi

echo "== bench"
start=$(date +%s)
"$rm" gen llama3-1b /tmp/l.gguf --type q4_k_m --quiet > "$out/gen.log" 2>&1 || cat "$out/gen.log"
"$rm" gen gemma3-270m /tmp/g.gguf --type q4_k_m --quiet >> "$out/gen.log" 2>&1 || cat "$out/gen.log"
echo "generated in $(( $(date +%s) - start )) s"
: > "$out/bench.log"
for mmv in 16; do
	echo "-- resident-bench, RESIDENT_CUDA_MMV_MAX=$mmv" | tee -a "$out/bench.log"
	RESIDENT_CUDA_MMV_MAX=$mmv timeout 150 "$rb" -m /tmp/l.gguf --device cuda -p 512 -n 128 -b 1,16 \
		>> "$out/bench.log" 2>&1
	echo "bench rc=$?" >> "$out/bench.log"
done
sb="$bin/cuda-step-bench"
: > "$out/step.log"
for cfg in "1 16" "0 16"; do
	set -- $cfg
	echo "-- cuda-step-bench llama3-1b q4_k_m, RESIDENT_CUDA_GRAPHS=$1 RESIDENT_CUDA_MMV_MAX=$2" >> "$out/step.log"
	RESIDENT_CUDA_GRAPHS=$1 RESIDENT_CUDA_MMV_MAX=$2 timeout 100 "$sb" /tmp/l.gguf 512 128 1 8 16 64 \
		>> "$out/step.log" 2>&1
done
echo "-- cuda-step-bench gemma3-270m q4_k_m" >> "$out/step.log"
timeout 100 "$sb" /tmp/g.gguf 512 128 1 16 64 >> "$out/step.log" 2>&1
echo "-- GPU time per phase (RESIDENT_CUDA_TIMING=2, no graphs), llama3-1b" >> "$out/step.log"
RESIDENT_CUDA_TIMING=2 timeout 100 "$sb" /tmp/l.gguf 512 128 1 64 > "$out/phases.log" 2>&1
grep -v 'cuda step of' "$out/phases.log" >> "$out/step.log"
for n in 512 1 64; do # the last step of each size: warm, past the one-time costs
	grep "cuda step of $n tokens" "$out/phases.log" | tail -n 1 >> "$out/step.log"
done

echo "== summary"
cat "$out/gpu.txt"
echo "test_cuda_ops rc=$ops_rc, test_cuda rc=$test_rc, test_hf.py rc=$hf_rc," \
    "memcheck rc=$san_ops_rc/$san_rc"
grep -E 'max relative' "$out/test_cuda.log"
grep -E 'ERROR SUMMARY' "$out/memcheck_ops.log" "$out/memcheck.log"
cat "$out/bench.log" "$out/step.log"
