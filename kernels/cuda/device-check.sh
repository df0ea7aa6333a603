#!/bin/sh
# device-check.sh: the CUDA backend on a GPU machine in one go: the tests
# against the CPU backend (with a generated gemma3-270m as the "real" Gemma,
# for head_dim 256), compute-sanitizer's memcheck over a few models, and
# cuda-step-bench (depths 128, 4096, 16384; GPU argmax checked against the
# host's) and resident-bench on a generated llama3-8b Q4_K_M. Logs go to
# OUTDIR; a short table is printed last. About 6 minutes on an H100.
#
#   kernels/cuda/device-check.sh BINDIR OUTDIR
#
# BINDIR holds test_cuda, resident-bench, resident-model and cuda-step-bench
# (copies from a build directory, with the shared libraries they need that
# the GPU machine may lack in BINDIR/lib). The lent GPU machines have no
# autotools or -dev packages, so the programs are built elsewhere: configure
# with CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a", make, make
# kernels/cuda/cuda-step-bench, copy the four programs into .carry/cuda and
# libcmocka.so.0, libjansson.so.4, libpcre2-8.so.0 into .carry/cuda/lib, and
# run this with .carry/cuda carried.
set -u
bin=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
cuda_lib=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
export LD_LIBRARY_PATH="$bin/lib:$cuda_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t=$(find "$bin" -maxdepth 3 -name test_cuda -type f | grep -v '/lib/' | head -n 1)
rb="$bin/resident-bench"
rm=$(find "$bin" -maxdepth 1 -name resident-model -type f | head -n 1)

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader |
	tee "$out/gpu.txt"
missing=$(ldd "$t" "$rb" "$rm" 2>&1 | grep 'not found' | sort -u)
[ -n "$missing" ] && echo "missing libraries: $missing"

echo "== test_cuda (RESIDENT_GEMMA: a generated gemma3-270m, head_dim 256)"
start=$(date +%s)
"$rm" gen gemma3-270m /tmp/g.gguf --type q4_k_m --quiet > "$out/gen.log" 2>&1 || cat "$out/gen.log"
RESIDENT_GEMMA=/tmp/g.gguf "$t" > "$out/test_cuda.log" 2>&1
test_rc=$?
grep -E 'max relative|PASSED|FAILED|SKIP|ERROR|error' "$out/test_cuda.log" | head -40
echo "test_cuda rc=$test_rc ($(( $(date +%s) - start )) s)"

echo "== compute-sanitizer memcheck"
start=$(date +%s)
TEST_CUDA_ONLY="tiny-gemma3/q4_k_m,tiny-qwen2/f16,tiny/q8_0" timeout 150 \
	compute-sanitizer --tool memcheck --error-exitcode 9 "$t" > "$out/memcheck.log" 2>&1
san_rc=$?
grep -E 'ERROR SUMMARY|Invalid|max relative|PASSED|FAILED' "$out/memcheck.log" | head -20
echo "memcheck rc=$san_rc ($(( $(date +%s) - start )) s)"

echo "== bench: llama3-8b Q4_K_M"
start=$(date +%s)
"$rm" gen llama3-8b /tmp/l8.gguf --type q4_k_m --quiet >> "$out/gen.log" 2>&1 || cat "$out/gen.log"
echo "generated in $(( $(date +%s) - start )) s"
sb="$bin/cuda-step-bench"
: > "$out/step.log"
for d in 128 4096; do
	echo "-- cuda-step-bench, depth $d" >> "$out/step.log"
	timeout 90 "$sb" /tmp/l8.gguf 512 $d 1 4 8 16 64 >> "$out/step.log" 2>&1
	echo "   rc=$?" >> "$out/step.log"
done
echo "-- cuda-step-bench, depth 16384" >> "$out/step.log"
timeout 60 "$sb" /tmp/l8.gguf 512 16384 1 >> "$out/step.log" 2>&1
echo "-- GPU time per phase (RESIDENT_CUDA_TIMING=2, no graphs), b=1, depth 128" >> "$out/step.log"
RESIDENT_CUDA_TIMING=2 timeout 60 "$sb" /tmp/l8.gguf 64 128 1 > "$out/phases.log" 2>&1
grep 'cuda step of 1 tokens' "$out/phases.log" | tail -n 1 >> "$out/step.log"
timeout 120 "$rb" -m /tmp/l8.gguf --device cuda -p 512 -n 128 -b 1,4,16,64 -r 2 > "$out/bench.log" 2>&1
echo "bench rc=$?" >> "$out/bench.log"

echo "== summary"
cat "$out/gpu.txt"
echo "test_cuda rc=$test_rc, memcheck rc=$san_rc"
grep -E 'max relative' "$out/test_cuda.log"
grep -E 'ERROR SUMMARY' "$out/memcheck.log"
grep -v '^|--' "$out/step.log"
tail -n 7 "$out/bench.log"
