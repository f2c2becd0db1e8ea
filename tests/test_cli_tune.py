"""`ragpilot tune | report | tuner-eval` end to end on the synthetic world (random search in this
process, a small policy file), MLflow logging to a temporary SQLite store, and exit code 2 on
bad input."""

import json
from pathlib import Path

import mlflow
import pytest
import yaml

from serving.cli import main

SMALL = {"policy": {"k_grid": [3, 5], "fusion_grid": 0.5, "fusion_step": 0.5,
                    "discrete": {"variant": ["bm25", "hybrid"], "rerank": ["off"],
                                 "prompt_id": ["cite_concise"],
                                 # pinned: the heads issue 18 added
                                 "normalisation": ["minmax"], "rerank_depth": [30]},
                    "bounds": {"mmr_lambda": {"min": 1.0, "max": 1.0}},
                    "episode": {"length": 3, "batch_size": 30}}}


@pytest.fixture
def policy_file(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text(yaml.safe_dump(SMALL))
    return f


def test_tune_and_report(tmp_path, policy_file, capsys, monkeypatch):
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: keep it from leaking between tests
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    out = tmp_path / "run"
    # 5 full valid splits (120 queries) of query-evaluations: random scores each trial on all
    rc = main(["tune", "--method", "random", "--budget", "600", "--settings", str(policy_file),
               "--out", str(out), "--mlflow-dir", str(tmp_path / "ml")])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluations"] == 5 and summary["holdout"]["split"] == "test"
    best = yaml.safe_load((out / "best_config.yaml").read_text())["rag"]
    assert best["variant"] in ("bm25", "hybrid") and best["k"] in (3, 5)
    assert len((out / "curve.jsonl").read_text().splitlines()) == 5
    assert (out / "holdout" / "predictions.jsonl").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rl_autotuner"])
    assert len(runs) == 1
    assert runs.iloc[0]["params.dataset_id"] == "synthetic"
    assert runs.iloc[0]["params.k"] == str(best["k"])
    assert "metrics.reward" in runs.columns and runs.iloc[0]["tags.code_commit"]
    # the reward-curve plot is an artifact of the run, in the local store beside mlflow.db
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    run_id = runs.iloc[0]["run_id"]
    assert summary["mlflow"]["run_id"] == run_id  # summary.json was rewritten after logging
    assert json.loads((out / "summary.json").read_text())["mlflow"]["run_id"] == run_id

    def plots():
        return {a.path: a.file_size for a in client.list_artifacts(run_id, "plots")}

    assert plots()["plots/reward-curve.png"] > 1000
    local = client.download_artifacts(run_id, "plots/reward-curve.png", str(tmp_path / "dl"))
    assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((tmp_path / "ml" / "artifacts").rglob("reward-curve.png"))

    assert summary["query_evals"] == 600 and 1 <= summary["distinct_configs"] <= 5
    assert capsys.readouterr().out.count("trial random-0-") == 5  # progress, one per trial
    assert main(["report", "--run", str(out), "--settings", str(policy_file), "--grid"]) == 0
    report = (out / "report.md").read_text()
    assert "chosen − static default" in report and "chosen − grid best" in report
    assert (out / "pareto-cost.png").stat().st_size > 1000
    # Δ is the continuous reward's; gates are reported apart, per config, with evidence
    assert "Δ C (relative)" in report and "static default `" in report
    assert "faithfulness" in report and "relevancy" in report
    assert "To detect Δ = 0.03 faithfulness at 80% power" in report
    # report's plots join the tune run in MLflow
    got = plots()
    assert {"plots/pareto-cost.png", "plots/pareto-p95_latency_ms.png"} <= set(got)


def test_tuner_eval_prints_report(capsys):
    assert main(["tuner-eval", "--set", "variant=bm25", "--set", "k=3",
                 "--batch-size", "20"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n"] == 20 and rep["config"]["k"] == 3 and "passed" in rep["gates"]


@pytest.mark.parametrize(("argv", "field"), [
    (["tune", "--method", "nope"], "--method"),
    (["tune", "--budget", "0"], "--budget"),
    (["tune", "--budget-unit", "configs"], "--budget-unit"),  # one unit: query-evaluations
    (["tune", "--checkpoint"], "--checkpoint"),  # PPO's: the default searcher has none
    (["tune", "--method", "tpe", "--resume", "runs/x"], "--resume"),
    (["tuner-eval", "--set", "k=99"], "rag.k"),
    (["tuner-eval", "--split", "nope"], "split"),
    (["report", "--run", "/nonexistent"], "--run"),
])
def test_bad_input_exits_2(argv, field, capsys, tmp_path):
    assert main(argv + (["--out", str(tmp_path)] if argv[0] == "tune" else [])) == 2
    assert field in capsys.readouterr().err


def test_bad_policy_file_exits_2(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("policy:\n  reward_weights: {alpha: 0.5, gama: 0.1}\n")
    assert main(["tune", "--settings", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "policy.reward_weights.gama: unknown key" in capsys.readouterr().err
