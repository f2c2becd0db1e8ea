"""MLflow tracking with the local default (SQLite file under the run directory) or any
tracking URI (`MLFLOW_TRACKING_URI`, e.g. an `mlflow server`). Every run records the code
commit and the dataset manifest, so a number in MLflow can be traced to code and data."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag.config import RAGConfig
from rag.provenance import provenance_tags


def code_commit() -> str:
    """The commit (rag.provenance.code_commit: `+dirty` when tracked files changed)."""
    from rag.provenance import code_commit as commit

    return commit()


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
        mlflow.set_tags({**provenance_tags(manifest), "code_commit": code_commit(),
                         "dataset": str(manifest.get("dataset", "unknown"))})
        mlflow.log_text(json.dumps(dict(manifest), indent=2, sort_keys=True),
                        "dataset_manifest.json")
        if artifacts:
            mlflow.log_artifacts(str(artifacts))
        return run.info.run_id


def log_tuning_run(uri: str, dataset: str, method: str, seed: int, best: RAGConfig,
                   policy: Mapping[str, Any], steps: list[Mapping[str, Any]],
                   summary: Mapping[str, float], manifest: Mapping[str, Any],
                   artifacts: str | Path | None = None,
                   experiment: str = "rl_autotuner") -> str:
    """One MLflow run of the tuner: params = the chosen config's action fields + dataset and
    seed; metrics per evaluation step (faithfulness, relevancy, p95_latency, cost, reward);
    the summary; the policy and dataset manifest; the run directory as artifacts."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"{dataset}-{method}-seed{seed}") as run:
        mlflow.log_params({"variant": best.variant, "k": best.k, "rerank": best.rerank,
                           "fusion_weight": best.fusion_weight, "prompt_id": best.prompt_id,
                           "dataset_id": dataset, "seed": seed, "method": method,
                           "config_hash": best.config_hash})
        for i, s in enumerate(steps):
            mlflow.log_metrics({"faithfulness": float(s["faithfulness"]),
                                "relevancy": float(s["relevancy"]),
                                "p95_latency": float(s["p95_latency_ms"]),
                                "cost": float(s["cost"]), "reward": float(s["reward"])},
                               step=i)
        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in summary.items()})
        mlflow.set_tags({**provenance_tags(manifest), "code_commit": code_commit(),
                         "dataset": dataset})
        mlflow.log_text(json.dumps(dict(policy), indent=2, sort_keys=True), "policy.json")
        mlflow.log_text(json.dumps(dict(manifest), indent=2, sort_keys=True),
                        "dataset_manifest.json")
        if artifacts:
            mlflow.log_artifacts(str(artifacts))
        return run.info.run_id
