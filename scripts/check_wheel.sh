#!/usr/bin/env bash
# Build ragpilot's wheel, install it (not editable) into a fresh virtualenv and run the CLI from
# a directory outside the repository: the wheel must carry its defaults (configs/ as the package
# `ragpilot_configs`, the bundled reward models) and need nothing from the checkout.
#
#   scripts/check_wheel.sh                      # a fresh virtualenv under a temp dir
#   WHEEL_VENV=/tmp/w scripts/check_wheel.sh    # keep (and reuse) the test virtualenv
#   PYTHON=python3.11 scripts/check_wheel.sh    # the interpreter that builds and hosts the venv
#
# The CPU torch wheel goes first (an unpinned torch pulls gigabytes of CUDA packages); pip's
# cache is reused, so a warm run takes a minute or two. Exit code != 0 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
VENV=${WHEEL_VENV:-$work/venv}

echo "[wheel] building"
# the build backend of pyproject.toml in an isolated environment (from pip's cache when warm)
"$PY" -m pip wheel -q --no-deps -w "$work/dist" "$REPO" \
  2> >(grep -v "is ignored: it is neither" >&2)
whl=$(ls "$work"/dist/ragpilot-*.whl)
# list once: `unzip -l | grep -q` under pipefail fails at random (grep exits at the first match
# and unzip dies of SIGPIPE)
listing=$(unzip -l "$whl")
for f in ragpilot_configs/rl/tuner.yaml ragpilot_configs/splits/hotpotqa.json \
         ragpilot_configs/rag/default.yaml rag/bundled/reward_models/quality-rm/v1/weights.npz; do
  grep -q " $f\$" <<< "$listing" || { echo "[wheel] $f missing from $(basename "$whl")"; exit 1; }
done

echo "[wheel] installing $(basename "$whl") into $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }  # local index notices
quiet "$VENV/bin/pip" install -q torch==2.13.0
quiet "$VENV/bin/pip" install -q --force-reinstall --no-deps "$whl"  # a reused venv: this build
quiet "$VENV/bin/pip" install -q -c "$REPO/constraints.txt" "$whl[rl,cpu]"  # CI's versions

echo "[wheel] running from $work (outside the repository)"
cd "$work"
unset PYTHONPATH
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$VENV/bin/python" - <<'EOF'
import rag, rl, serving
from rag.resources import configs_root
root = str(configs_root())
assert "site-packages" in root, root
for mod in (rag, rl, serving):
    assert "site-packages" in mod.__file__, mod.__file__
print("[wheel] defaults from", root)
EOF
"$VENV/bin/ragpilot" --version
"$VENV/bin/ragpilot" tuner-eval --dataset synthetic
echo "[wheel] ok"
