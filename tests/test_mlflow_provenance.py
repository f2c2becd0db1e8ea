"""Every MLflow run the project logs carries the code commit and the dataset manifest
(sha256 of each input file, sha256 of the whole manifest): rl.common.tracking's eval and tuning runs
and the rollout transitions, logged into a temporary SQLite tracking store."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from rag.config import RAGConfig
from rag.corpus.loaders import sha256_file
from rag.provenance import code_commit, manifest_sha256, provenance_tags


@pytest.fixture
def manifest(tmp_path):
    a, b = tmp_path / "corpus.jsonl", tmp_path / "dev.jsonl"
    a.write_text('{"id": "p1", "text": "Paris is the capital of France."}\n')
    b.write_text('{"id": "q1", "question": "Capital of France?"}\n')
    return {"dataset": "toy", "inputs": [{"path": "toy/corpus.jsonl", "sha256": sha256_file(a)},
                                         {"path": "toy/dev.jsonl", "sha256": sha256_file(b)}],
            "passages": 1, "examples": 1, "corpus_fingerprint": "f00d"}


def test_provenance_tags(manifest) -> None:
    tags = provenance_tags(manifest)
    assert tags["dataset_sha256/toy/corpus.jsonl"] == manifest["inputs"][0]["sha256"]
    assert tags["dataset_sha256/toy/dev.jsonl"] == hashlib.sha256(
        b'{"id": "q1", "question": "Capital of France?"}\n').hexdigest()
    assert tags["dataset_manifest_sha256"] == manifest_sha256(dict(reversed(manifest.items())))
    changed = {**manifest, "examples": 2}
    assert provenance_tags(changed)["dataset_manifest_sha256"] != tags["dataset_manifest_sha256"]
    assert tags["corpus_fingerprint"] == "f00d" and tags["dataset"] == "toy"
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", tags["code_commit"])
    assert provenance_tags(None)["dataset_manifest_sha256"] == "unknown"


def _runs(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


def test_eval_and_tuning_runs_carry_commit_and_manifest(tmp_path, manifest, monkeypatch) -> None:
    from rl.common.tracking import log_eval_run, log_tuning_run, tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking_uri(tmp_path / "mlflow")
    assert uri.startswith("sqlite:///") and uri.endswith("mlflow.db")
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; setenv makes monkeypatch remove it
    # afterwards so later tests in this process get their own store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = RAGConfig(variant="bm25", k=3)
    eid = log_eval_run("prov_eval", "toy-bm25", cfg, {"f1": 0.5, "n": 1}, manifest, uri)
    step = {"faithfulness": 0.8, "relevancy": 0.7, "p95_latency_ms": 12.0, "cost": 90.0,
            "reward": 0.6}
    tid = log_tuning_run(uri, "toy", "random", 0, cfg, {"seed": 0}, [step], {"test_reward": 0.6},
                         manifest, experiment="prov_tune")
    for exp, run_id in (("prov_eval", eid), ("prov_tune", tid)):
        client, runs = _runs(uri, exp)
        (run,) = runs
        assert run.info.run_id == run_id
        t = run.data.tags
        assert t["code_commit"] == code_commit() != ""
        assert t["dataset_manifest_sha256"] == manifest_sha256(manifest)
        for item in manifest["inputs"]:
            assert t[f"dataset_sha256/{item['path']}"] == item["sha256"]
        local = client.download_artifacts(run_id, "dataset_manifest.json", str(tmp_path))
        assert json.loads(Path(local).read_text()) == manifest


def test_rollout_transition_run_carries_commit_and_manifest_id(tmp_path, monkeypatch) -> None:
    from rl.promotion.settings import PromotionSettings, _log_mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    cfg = PromotionSettings.model_validate({"mlflow": True, "mlflow_dir": str(tmp_path / "ml")})
    rec = {"rollout_id": "r1", "action": "advance", "from": "candidate", "to": "shadow",
           "config_hash": "c" * 12, "stable_hash": "s" * 12,
           "dataset_manifest_id": "hotpotqa@1a2b3c4d5e6f", "code_commit": code_commit(),
           "reason": "offline CI above 0", "evidence": {"diff": 0.05}}
    _log_mlflow(cfg, rec)
    _, runs = _runs(f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}", cfg.mlflow_experiment)
    (run,) = runs
    assert run.data.tags["code_commit"] == code_commit()
    assert run.data.tags["dataset_manifest_id"] == "hotpotqa@1a2b3c4d5e6f"
    assert run.data.metrics["diff"] == 0.05
