#!/bin/sh
# device-check.sh: what `make check-cuda` and the benchmark check, on a GPU
# machine that cannot build (the lent ones have no autotools or -dev
# packages): every kernel and whole models against the CPU backend
# (test_cuda_ops, test_cuda_attn, test_cuda_moe, test_cuda), logits
# against transformers (test_hf.py),
# the daemon on the GPU and on the CPU (test_gpu_cpu.py), the GPU's sampled
# draws against the host sampler's (test_gpu_sample.py), speculative
# decoding's tests on CUDA in exact mode (test_gpu_spec.py), the daemon
# under injected CUDA faults (test_gpu_faults.py), compute-sanitizer's
# memcheck and racecheck, then on a generated llama3-8b Q4_K_M the time to
# first token of a resumed 8000-token session (tests/bench/resume_ttft.py)
# and resident-bench. Logs go to OUTDIR; a short summary is printed last.
#
#   kernels/cuda/device-check.sh BINDIR OUTDIR
#
# Run from the source tree (the Python tests are read from it). BINDIR holds
# residentd, resident, resident-model, resident-bench, test_cuda, test_cuda_ops,
# test_cuda_attn and test_cuda_moe,
# and in BINDIR/lib the shared libraries the GPU machine lacks. Built here:
#
#   CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" ../configure && make &&
#   make tests/unit/test_cuda tests/unit/test_cuda_ops tests/unit/test_cuda_attn tests/unit/test_cuda_moe
#   mkdir -p ../.carry/b/lib && cp residentd .libs/resident resident-model resident-bench \
#     tests/unit/test_cuda tests/unit/test_cuda_ops tests/unit/test_cuda_attn \
#     tests/unit/test_cuda_moe ../.carry/b &&
#   strip ../.carry/b/* ;
#   cp -L $(ldd residentd tests/unit/test_cuda | grep -oE '/[^ ]*lib(cmocka|jansson|pcre2-8|event[a-z_]*-2[^ ]*|msgpackc|sqlite3)\.so[^ ]*' | sort -u) ../.carry/b/lib
#   cp -P .libs/libresident.so* ../.carry/b/lib   # the CLI's (test_gpu_spec.py runs it)
#
# and this runs with .carry/b carried. A resident-bench-old in BINDIR (a
# build of an earlier commit) is benchmarked too, in the same run, so that
# before and after are measured on one machine. The real Gemma 3 270M
# (253 MB) is more than one call carries: split it into pieces of 50 MB,
# carry one per call and copy it to /tmp while the machine stays warm, join
# them in the last call and name the file in RESIDENT_GEMMA (test_cuda and
# test_gpu_cpu.py and test_gpu_sample.py use it; without it they say what they skipped).
#
# DEVICE_CHECK_STEPS (default "ops cuda hf gpu_cpu gpu_sample gpu_spec faults memcheck
# resume bench") picks
# the steps; DEVICE_CHECK_BENCH (default below) the bench's rows.
set -u
bin=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RESIDENT_BUILDDIR="$bin" PYTHONUNBUFFERED=1
steps=${DEVICE_CHECK_STEPS:-ops cuda hf gpu_cpu gpu_sample gpu_spec faults memcheck resume bench}
bench_rows=${DEVICE_CHECK_BENCH:--p 512,4096 -n 128 -b 1,4,16,32,64 -r 2}
model=/tmp/l8.gguf

# run NAME SECONDS COMMAND...: the command's output in OUTDIR/NAME.log, its status and time printed
run() {
	n=$1
	shift
	t0=$(date +%s)
	timeout "$@" > "$out/$n.log" 2>&1
	echo "$n rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$out/summary.txt"
}

has() {
	case " $steps " in *" $1 "*) return 0 ;; esac
	return 1
}

: > "$out/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
# the model is generated on all cores while the GPU tests run
gen_pid=
if { has bench || has resume; } && [ ! -f $model ]; then
	( timeout 400 "$bin/resident-model" gen llama3-8b $model.part --type q4_k_m --quiet > "$out/gen.log" 2>&1 &&
	    mv $model.part $model ) &
	gen_pid=$!
fi
if has ops; then
	for t in test_cuda_ops test_cuda_attn test_cuda_moe; do
		run $t 240 "$bin/$t"
	done
fi
has cuda && run test_cuda 300 "$bin/test_cuda"
has hf && run test_hf 300 python3 tests/cuda/test_hf.py
has gpu_cpu && run test_gpu_cpu 300 python3 tests/e2e/test_gpu_cpu.py
has gpu_sample && run test_gpu_sample 300 python3 tests/e2e/test_gpu_sample.py
has gpu_spec && run test_gpu_spec 400 python3 tests/e2e/test_gpu_spec.py
has faults && run test_gpu_faults 400 python3 tests/e2e/test_gpu_faults.py
if has memcheck; then
	for t in ops attn moe; do
		run memcheck_$t 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_$t"
		run racecheck_$t 400 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_cuda_$t"
	done
	TEST_CUDA_ONLY=${CUDA_MEMCHECK_ONLY:-tiny-gemma3/q4_k_m,tiny-qwen2/f16,tiny/q8_0,tiny-qwen3/q4_k_m}
	export TEST_CUDA_ONLY
	run memcheck_cuda 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda"
	unset TEST_CUDA_ONLY
fi
[ -n "$gen_pid" ] && wait $gen_pid && echo "gen: $(ls -la $model 2>&1)" >> "$out/summary.txt"
has resume && run resume_ttft 500 python3 tests/bench/resume_ttft.py -m $model --tokens 8000 -- --device cuda
if has bench; then
	# shellcheck disable=SC2086 # the rows are words
	[ -x "$bin/resident-bench-old" ] &&
	    run bench_old 300 "$bin/resident-bench-old" -m $model --device cuda $bench_rows
	# shellcheck disable=SC2086
	run bench 300 "$bin/resident-bench" -m $model --device cuda $bench_rows
fi

echo "== summary"
grep -hE 'max error|max relative|worst' "$out/test_cuda_ops.log" "$out/test_cuda_attn.log" \
    "$out/test_cuda_moe.log" "$out/test_cuda.log" 2>/dev/null
grep -hE 'cuda|^PASS|^FAIL|SKIP|identical' "$out/test_hf.log" "$out/test_gpu_cpu.log" "$out/test_gpu_sample.log" \
    "$out/test_gpu_faults.log" \
    2>/dev/null | tail -n 24
[ -f "$out/resume_ttft.log" ] && tail -n 8 "$out/resume_ttft.log"
grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$out"/memcheck_*.log "$out"/racecheck_*.log 2>/dev/null
cat "$out/summary.txt"
for b in bench_old bench; do
	[ -f "$out/$b.log" ] && echo "-- $b" && cat "$out/$b.log"
done
exit 0
