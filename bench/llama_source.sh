#!/bin/sh
# llama.cpp as vendored in llama-cpp-python's source distribution, unpacked once into the
# cache: what bench/build_llama_server.sh builds llama-server from, and where the tests find
# llama.cpp's own convert_hf_to_gguf.py, convert_lora_to_gguf.py, gguf-py and chat templates.
# The sdist comes from the package index (pip download: fetched, never installed) unless
# SDIST names a file. Prints the folder.
#   usage: bench/llama_source.sh [SDIST]   (PYTHON: the interpreter whose pip downloads; python3)
set -eu
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${AGENTKV_CACHE:-$HOME/.cache/agentkv}
work=$CACHE/build-llama-server-$VERSION
if [ ! -f "$work/src/convert_hf_to_gguf.py" ]; then
    SDIST=${1:-$CACHE/sdists/llama_cpp_python-$VERSION.tar.gz}
    if [ ! -f "$SDIST" ]; then
        mkdir -p "$(dirname "$SDIST")"
        echo "llama_source: downloading llama-cpp-python $VERSION's source distribution (~75 MB) ..." >&2
        "${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
            "llama-cpp-python==$VERSION" -d "$(dirname "$SDIST")" >&2
    fi
    # unpacked beside the target and moved into place, so an interrupted run leaves no half folder
    mkdir -p "$work"
    tmp=$(mktemp -d "$work/unpack.XXXXXX")
    tar -xzf "$SDIST" -C "$tmp" "llama_cpp_python-$VERSION/vendor/llama.cpp"
    rm -rf "$work/src"
    mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$work/src"
    rm -rf "$tmp"
fi
echo "$work/src"
