#!/usr/bin/env bash
# Optional: the llama.cpp runtime (llama-cpp-python) for GGUF generators and embedders.
# PyPI ships it as source only and no prebuilt binding loads here (llama-cpp-py-sync's
# "manylinux2014" wheels need glibc 2.38), so this compiles it ONCE (~9 min on 2 idle cores)
# into a wheel cached under $RAGPILOT_CACHE/wheels and installs that wheel with --no-deps (its
# deps -- numpy, jinja2, diskcache, typing-extensions -- come with ragpilot[dev]).
# Never part of `make setup`/`make test`: tests that need it skip with a reason.
#   bash scripts/build_llama_cpp.sh                 # build once, install into .venv
#   LLAMA_TARGET=/tmp/llama bash scripts/build_llama_cpp.sh   # install into a folder instead
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
VENV=${VENV:-.venv}
WHEELS=${RAGPILOT_CACHE:-$HOME/.cache/ragpilot}/wheels
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$WHEELS"
wheel=$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "[llama.cpp] compiling llama-cpp-python $VERSION once (CPU, ~9+ minutes)"
  # CPU only, no server/examples/tests/curl: the smallest build that loads GGUF and embeds.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF}" \
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$VENV/bin/pip" wheel -q --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$VERSION" -w "$WHEELS" 2> >(grep -v "is ignored: it is neither" >&2)
  wheel=$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl | head -1)
fi
if [ -n "${LLAMA_TARGET:-}" ]; then
  "$VENV/bin/pip" install -q --no-deps --upgrade --target "$LLAMA_TARGET" "$wheel"
else
  "$VENV/bin/pip" install -q --no-deps "$wheel"
fi
echo "[llama.cpp] ready: $wheel"
