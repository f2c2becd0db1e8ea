"""MLflow tracking with the local default (SQLite file under the run directory) or any
tracking URI (`MLFLOW_TRACKING_URI`, e.g. an `mlflow server`). Every run records the code
commit and the dataset manifest, so a number in MLflow can be traced to code and data."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag.config import RAGConfig


def code_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tracking_uri(default_dir: str | Path) -> str:
    """$MLFLOW_TRACKING_URI if set, else sqlite:///<default_dir>/mlflow.db."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    d = Path(default_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


def log_eval_run(experiment: str, run_name: str, config: RAGConfig,
                 summary: Mapping[str, Any], manifest: Mapping[str, Any], uri: str,
                 artifacts: str | Path | None = None) -> str:
    """One MLflow run: params = the config (+ hash), metrics = numeric summary entries,
    tags = commit and dataset; the manifest and the run's files as artifacts. Returns run id."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params({**config.model_dump(mode="json"), "config_hash": config.config_hash})
        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in summary.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
        mlflow.set_tags({"code_commit": code_commit(),
                         "dataset": str(manifest.get("dataset", "unknown"))})
        mlflow.log_text(json.dumps(dict(manifest), indent=2, sort_keys=True),
                        "dataset_manifest.json")
        if artifacts:
            mlflow.log_artifacts(str(artifacts))
        return run.info.run_id
