"""What a finished reranker training leaves behind: a versioned model directory, a registry
entry, an MLflow run.

- `next_version_dir` claims `<cache>/models/<name>/v<N>/` (created here, so two runs never share
  a number); `save_model` writes safetensors + tokenizer + manifest.json into it.
- `register_local` registers it through `rag.model_registry_writer` in the local registry file
  (`rag.models.local_registry_path()`): `<name>` (latest), `<name>@v<N>` and `<name>@best`, the
  best being decided by the eval metric `<dataset>_<split>_<metric>`, higher is better.
- `log_mlflow` records params, metrics, provenance tags and the manifest, and a registered model
  version with `newest` / `best` aliases.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from rl.adaptation.reranker_config import RerankerTrainConfig
from rl.adaptation.reranker_model import TrainResult, resolve_base


def models_root() -> Path:
    from rag.models import cache_dir

    return cache_dir() / "models"


def next_version_dir(name: str, root: Path | None = None) -> Path:
    """Claim the next free `<root>/<name>/v<N>` (created empty); `mkdir` fails when another
    run claimed N first, and the next N is tried, so concurrent runs get distinct versions."""
    base = (root or models_root()) / name
    base.mkdir(parents=True, exist_ok=True)
    while True:
        versions = [int(m.group(1)) for p in base.iterdir()
                    if (m := re.fullmatch(r"v(\d+)", p.name))]
        dest = base / f"v{max(versions, default=0) + 1}"
        try:
            dest.mkdir()
        except FileExistsError:
            continue
        return dest


def save_model(result: TrainResult, cfg: RerankerTrainConfig, dest: Path,
               metrics: dict[str, Any], data_sources: dict[str, Any]) -> dict[str, Any]:
    """safetensors + tokenizer + manifest.json into `dest`; returns the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    result.model.save_pretrained(str(dest), safe_serialization=True)
    result.tokenizer.save_pretrained(str(dest))
    manifest = {
        "name": cfg.name, "version": dest.name, "kind": "cross_encoder",
        "base_model": cfg.base_model, "base_model_path": str(resolve_base(cfg.base_model)),
        "head": "linear on the pooled [CLS] state (BertForSequenceClassification, 1 logit)",
        "config": cfg.model_dump(mode="json"), "config_fingerprint": cfg.fingerprint(),
        "data_hash": result.data_hash, "data_sources": data_sources,
        "steps": result.steps_done, "sequences": result.sequences, "tokens": result.tokens,
        "train_seconds": round(result.seconds, 1),
        "pairs_per_s": round(result.pairs_per_s, 3), "tokens_per_s": round(result.tokens_per_s, 1),
        "final_loss": float(np.mean(result.losses[-10:])) if result.losses else None,
        "eval": metrics, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def register_local(name: str, version_dir: Path, best_metric: str | None,
                   registry_file: Path | None = None) -> dict[str, str]:
    """Register `version_dir` (`.../v<N>`) in the local registry YAML that
    `rag.models.default_registry` reads (or `registry_file`) as `<name>`, `<name>@v<N>`; its
    score is `eval[best_metric]` of its manifest.json, and `<name>@best` moves to it only when
    that score is higher than every earlier version's on the same metric. Returns the paths
    {"latest", "best"}."""
    from rag.model_registry_writer import register_version
    from rag.models import local_registry_path

    man = version_dir / "manifest.json"
    evals = json.loads(man.read_text()).get("eval", {}) if man.exists() else {}
    val = evals.get(best_metric) if best_metric else None
    score = float(val) if isinstance(val, (int, float)) and not isinstance(val, bool) else None
    m = re.fullmatch(r"v(\d+)", version_dir.name)
    reg = register_version(registry_file or local_registry_path(), name, "cross_encoder", "hf",
                           version_dir, version=int(m.group(1)) if m else None,
                           metric=best_metric, score=score, higher_is_better=True)
    return {"latest": str(version_dir), "best": reg.best_path}


def training_manifest(data_sources: dict[str, Any]) -> dict[str, Any]:
    """One dataset manifest for a run that mined several datasets: the names joined with '+',
    every source's input files (path, sha256), so `rag.provenance.provenance_tags` can tag it."""
    names, inputs = [], []
    for name, src in sorted(data_sources.items()):
        names.append(f"{name}/{src.get('split', '?')}")
        inputs.extend((src.get("manifest") or {}).get("inputs") or [])
    return {"dataset": "+".join(names), "inputs": inputs}


def log_mlflow(cfg: RerankerTrainConfig, manifest: dict[str, Any], version_dir: Path,
               aliases: dict[str, str]) -> dict[str, Any]:
    """A run (params, metrics, manifest artifact) and, when the registry works on this store, a
    registered model version (source = the versioned directory) with `latest` / `best`
    aliases. Returns what was done, for the report."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from rag.provenance import provenance_tags
    from rl.common.tracking import code_commit, tracking_uri

    uri = tracking_uri(cfg.mlflow_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("reranker_training")
    out: dict[str, Any] = {"tracking_uri": uri}
    with mlflow.start_run(run_name=f"{cfg.name}-{version_dir.name}") as run:
        mlflow.log_params({k: v for k, v in cfg.model_dump(mode="json").items()
                           if not isinstance(v, dict)})
        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in
                            {**manifest["eval"], "pairs_per_s": manifest["pairs_per_s"],
                             "tokens_per_s": manifest["tokens_per_s"],
                             "steps": manifest["steps"]}.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
        mlflow.set_tags({**provenance_tags(training_manifest(manifest.get("data_sources", {}))),
                         "code_commit": code_commit(), "base_model": cfg.base_model,
                         "model_dir": str(version_dir), "version": version_dir.name,
                         "data_hash": manifest["data_hash"],
                         "alias_latest": aliases["latest"], "alias_best": aliases["best"]})
        mlflow.log_text(json.dumps(manifest, indent=1, sort_keys=True), "manifest.json")
        out["run_id"] = run.info.run_id
    try:
        client = MlflowClient(uri)
        try:
            client.get_registered_model(cfg.name)
        except Exception:  # noqa: BLE001 - "not found" has no stable exception type
            client.create_registered_model(cfg.name)
        mv = client.create_model_version(cfg.name, source=str(version_dir),
                                         run_id=out["run_id"],
                                         tags={"version_dir": version_dir.name})
        # MLflow reserves the alias name "latest" (models:/<name>/latest is built in), so the
        # newest version is reached that way and gets a "newest" alias; "best" is set as is.
        client.set_registered_model_alias(cfg.name, "newest", mv.version)
        best_v = mv.version
        if aliases["best"] != str(version_dir):
            for v in client.search_model_versions(f"name='{cfg.name}'"):
                if v.source == aliases["best"]:
                    best_v = v.version
        client.set_registered_model_alias(cfg.name, "best", best_v)
        out.update(registered=True, model_version=mv.version, best_version=best_v,
                   latest_uri=f"models:/{cfg.name}/latest", best_uri=f"models:/{cfg.name}@best")
    except Exception as exc:  # noqa: BLE001 - the run's tags + manifest artifact still hold it
        out.update(registered=False, registry_error=f"{type(exc).__name__}: {exc}"[:300])
    return out

