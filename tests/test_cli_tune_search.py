"""`ragpilot tune` with its default method (local-asha) on Ray Tune (`--max-concurrent 1`) end to
end: the search under a query budget writes the run directory (Tune's experiment inside it),
logs each trial to MLflow beside the tuning run; a cluster flag with ppo is a usage error."""

import json

import mlflow
import pytest
import yaml

from serving.cli import main

pytestmark = pytest.mark.ray

SMALL = {"policy": {"k_grid": [3, 5], "fusion_grid": 0.5, "fusion_step": 0.5,
                    "discrete": {"variant": ["bm25", "hybrid"], "rerank": ["off"],
                                 "prompt_id": ["cite_concise"]}}}


def test_tune_with_a_ray_tune_searcher(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "run"
    assert main(["tune", "--budget", "480", "--settings", str(policy), "--max-concurrent", "1",
                 "--out", str(out), "--mlflow-dir", str(tmp_path / "ml")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "local-asha" and summary["budget"] == 480
    assert summary["query_evals"] >= 480 and summary["warm_start"]
    assert (out / "ray_tune" / "local-asha-seed0").is_dir()  # never ~/ray_results
    steps = [json.loads(x) for x in (out / "curve.jsonl").read_text().splitlines()]
    assert len(steps) == summary["evaluations"]
    assert steps[-1]["cum_query_evals"] == summary["query_evals"]
    best = yaml.safe_load((out / "best_config.yaml").read_text())["rag"]
    assert best["k"] in (3, 5) and summary["holdout"]["split"] == "test"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}")
    trials = mlflow.search_runs(experiment_names=["rl_autotuner_trials"])
    assert len(trials) == len({s["trial_id"] for s in steps})
    assert "metrics.reward" in trials.columns and "metrics.violation_relevancy" in trials.columns
    assert len(mlflow.search_runs(experiment_names=["rl_autotuner"])) == 1


def test_trial_flags_do_not_fit_ppo(capsys, tmp_path):
    assert main(["tune", "--method", "ppo", "--max-concurrent", "2", "--out",
                 str(tmp_path)]) == 2
    assert "--max-concurrent" in capsys.readouterr().err
