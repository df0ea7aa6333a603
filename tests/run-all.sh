#!/bin/sh
# The whole test suite: a normal build and an ASan+UBSan build, each with
# `make check` (unit tests, end-to-end tests, comparisons with independent
# implementations), then, with the normal build, the tests judged on time
# alone (make check-fairness: the gaps between tokens, a grammar's preparation,
# which tests run beside them would stretch) and end-to-end tests with residentd under
# valgrind (tests/valgrind.sh). GPU tests run too where a GPU is present, and say they
# are skipped where not. Socket activation is tested both ways: the release
# build takes sd_listen_fds from libsystemd where it is installed, the ASan
# build reads LISTEN_FDS itself.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
cd "$top"
# Without a GPU the CUDA code only has to compile, and its two code paths
# (sm_80's and sm_90a's: __CUDA_ARCH__ >= 900) do that at half the build time
# of configure's four targets. A CUDA_ARCH given here is kept.
if ! nvidia-smi -L >/dev/null 2>&1; then
	: "${CUDA_ARCH:=-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a}"
	export CUDA_ARCH
fi
[ -x configure ] || autoreconf -fi >/dev/null 2>&1
for variant in release asan; do
	dir="$top/build/$variant"
	mkdir -p "$dir"
	cd "$dir"
	flags=
	[ "$variant" = asan ] && flags="--enable-asan --disable-cuda --without-systemd"
	[ -f Makefile ] || "$top/configure" -q $flags
	echo "== $variant build"
	make -s -j"$jobs"
	echo "== $variant make check"
	if ! make -s -j"$jobs" check; then
		find . -name '*.log' -path '*tests*' -newer Makefile -exec grep -l -E '^(FAIL|ERROR)' {} + |
			while read -r log; do echo "---- $log"; tail -n 40 "$log"; done
		exit 1
	fi
	if [ "$variant" = release ]; then
		echo "== release: fairness and grammar edges, alone"
		make -s check-fairness
		echo "== release: residentd under valgrind"
		sh "$top/tests/valgrind.sh" "$dir"
	fi
done
echo "all test suites passed"
