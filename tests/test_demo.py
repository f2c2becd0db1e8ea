"""The main job end to end (quick mode, no LLM row): indexes, configs, files, MLflow runs."""

import json

from rich.console import Console


def test_quick_demo_writes_summary_and_mlflow_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from serving.demo import DEMO_CONFIGS, run_demo

    console = Console(record=True, width=140)
    results = run_demo(out=tmp_path, with_llm=False, quick=True, console=console)
    assert [r["label"] for r in results] == [label for label, _ in DEMO_CONFIGS]
    by = {r["label"]: r for r in results}
    # the graph walk reaches second-hop passages that plain BM25 misses
    assert by["graph (PPR)"]["recall@k"] > by["bm25"]["recall@k"]
    assert all(0 <= r["f1"] <= 1 and r["n"] == 60 for r in results)
    assert json.loads((tmp_path / "summary.json").read_text()) == results
    text = console.export_text()
    assert "hybrid + MMR 0.6" in text and "p95 ms" in text

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["ragpilot_demo"])
    assert len(runs) == len(DEMO_CONFIGS)
    assert set(runs["params.config_hash"]) == {r["config_hash"] for r in results}
    assert runs["tags.code_commit"].str.len().min() >= 7
