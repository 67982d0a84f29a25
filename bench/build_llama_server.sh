#!/bin/sh
# Builds llama.cpp's `llama-server` (the peer of `agentkv bench long`, `disk`, `hybrid`, ...)
# from the vendored llama.cpp in llama-cpp-python's source distribution (llama_source.sh
# fetches and unpacks it), with the flags of llama_cmake_args.sh (GGML_NATIVE off, AMX always
# off), nice'd, only the llama-server target. The binary is cached outside the repository; a
# second run only prints its path.
#   usage: bench/build_llama_server.sh [SDIST]   (default: the sdist downloaded from the index)
set -eu
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${AGENTKV_CACHE:-$HOME/.cache/agentkv}
BIN=$CACHE/llama-server-$VERSION
JOBS=${JOBS:-2}
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
here=$(cd "$(dirname "$0")" && pwd)
src=$(sh "$here/llama_source.sh" "$@")
work=$(dirname "$src")
# shellcheck disable=SC2046  # the flags are one word each
nice -n 10 cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF $(sh "$here/llama_cmake_args.sh") >&2
nice -n 10 cmake --build "$work/build" --target llama-server -j "$JOBS" >&2
cp "$work/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
