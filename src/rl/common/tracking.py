"""MLflow tracking with the local default (SQLite file under the run directory) or any
tracking URI (`MLFLOW_TRACKING_URI`, e.g. an `mlflow server`). Every run records the code
commit and the dataset manifest, so a number in MLflow can be traced to code and data.

With a local SQLite store, an experiment this module creates keeps its artifacts beside the
database (`<dir>/artifacts/`), not in `./mlruns` of whatever directory the process ran in.
Plots (PNG) go under the run's `plots/` artifact folder (`log_tuning_run(plots=...)`,
`log_plots` for plots made later, e.g. by `ragpilot report`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
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


def set_experiment(experiment: str, uri: str) -> str:
    """Point mlflow at `uri` and `experiment`, creating it when missing (artifacts beside a
    local SQLite store: `<dir of mlflow.db>/artifacts`). Returns the experiment id."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None and uri.startswith("sqlite:///"):
        art = Path(uri[len("sqlite:///"):]).resolve().parent / "artifacts"
        mlflow.create_experiment(experiment, artifact_location=art.as_uri())
    return mlflow.set_experiment(experiment).experiment_id


def log_plots(uri: str, run_id: str, paths: Sequence[str | Path],
              artifact_path: str = "plots") -> list[str]:
    """Add the files `paths` (PNG plots) to an existing run under `artifact_path`; returns the
    artifact paths written (files that do not exist are skipped)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    out = []
    for p in paths:
        if Path(p).is_file():
            client.log_artifact(run_id, str(p), artifact_path)
            out.append(f"{artifact_path}/{Path(p).name}")
    return out


def log_eval_run(experiment: str, run_name: str, config: RAGConfig,
                 summary: Mapping[str, Any], manifest: Mapping[str, Any], uri: str,
                 artifacts: str | Path | None = None) -> str:
    """One MLflow run: params = the config (+ hash), metrics = numeric summary entries,
    tags = commit and dataset; the manifest and the run's files as artifacts. Returns run id."""
    import mlflow

    set_experiment(experiment, uri)
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
                   experiment: str = "rl_autotuner",
                   plots: Sequence[str | Path] = ()) -> str:
    """One MLflow run of the tuner: params = the chosen config's action fields + dataset and
    seed; metrics per evaluation step (faithfulness, relevancy, p95_latency, cost, reward);
    the summary; the policy and dataset manifest; the run directory as artifacts; `plots`
    (PNG files, e.g. the reward curve) under `plots/`."""
    import mlflow

    set_experiment(experiment, uri)
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
        for p in plots:
            mlflow.log_artifact(str(p), "plots")
        return run.info.run_id


def log_trials(uri: str, experiment: str, trials: Sequence[Mapping[str, Any]],
               history: Sequence[Mapping[str, Any]], tags: Mapping[str, str]) -> list[str]:
    """One MLflow run per search trial, written after the search in one batch per run
    (Tune's MLflowLoggerCallback writes per result and cost ~1.4 s per trial on a local SQLite
    store here). `trials`: {"trial_id", "config_hash", "params"} each; `history`: the reported
    results ({"trial_id", numeric metrics...}, in order: one MLflow step per result of a
    trial); `tags` join each run's tags. Returns the run ids, in `trials` order."""
    import time

    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    exp_id = set_experiment(experiment, uri)
    client = MlflowClient(uri)
    ts = int(time.time() * 1000)
    ids = []
    for t in trials:
        run = client.create_run(exp_id, run_name=str(t["trial_id"]),
                                tags={**tags, "config_hash": str(t["config_hash"])})
        rows = [h for h in history if h["trial_id"] == t["trial_id"]]
        metrics = [Metric(k.replace("@", "_at_"), float(v), ts, step)
                   for step, h in enumerate(rows) for k, v in h.items()
                   if isinstance(v, (int, float)) and k != "trial_id"]
        params = [Param(k, str(v)[:6000]) for k, v in sorted(t["params"].items())]
        client.log_batch(run.info.run_id, metrics=metrics, params=params,
                         tags=[RunTag("code_commit", code_commit())])
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    return ids
