"""Process-wide environment defaults that every entry point needs on this stack.

Measured here (see docs/architecture.md): torch with more than one thread per process is
3-10x slower on a 2-core machine once anything else runs; Hugging Face libraries must never
try the network. Values already set by the user win.
"""

from __future__ import annotations

import os

DEFAULTS: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "RAGAS_DO_NOT_TRACK": "true",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


def configure_runtime_env() -> None:
    """Set the defaults above unless the user already chose a value."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
