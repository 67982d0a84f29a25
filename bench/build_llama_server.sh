#!/bin/sh
# Builds llama.cpp's `llama-server` (the peer of `agentkv bench disk`) from the vendored
# llama.cpp in llama-cpp-python's source distribution, with the flags of llama_cmake_args.sh
# (GGML_NATIVE off, AMX always off), nice'd, only the llama-server target. The binary is
# cached outside the repository; a second run only prints its path.
#   usage: bench/build_llama_server.sh [SDIST]   (default: /work/wheels/llama_cpp_python-$VERSION.tar.gz)
set -eu
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${AGENTKV_CACHE:-$HOME/.cache/agentkv}
BIN=$CACHE/llama-server-$VERSION
SDIST=${1:-/work/wheels/llama_cpp_python-$VERSION.tar.gz}
JOBS=${JOBS:-2}
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if [ ! -f "$SDIST" ]; then
    echo "no source distribution at $SDIST; get it with:" >&2
    echo "  pip download --no-deps --no-binary :all: llama-cpp-python==$VERSION -d $(dirname "$SDIST")" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$CACHE/build-llama-server-$VERSION
mkdir -p "$work"
[ -d "$work/src" ] || { tar -xzf "$SDIST" -C "$work"; mv "$work/llama_cpp_python-$VERSION/vendor/llama.cpp" "$work/src"; }
# shellcheck disable=SC2046  # the flags are one word each
nice -n 10 cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF $(sh "$here/llama_cmake_args.sh") >&2
nice -n 10 cmake --build "$work/build" --target llama-server -j "$JOBS" >&2
cp "$work/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
