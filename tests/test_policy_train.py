"""`ragpilot router train` (issue 19: the supervised router is the shipped per-query policy, so a
user must be able to train it and serve it): on the synthetic world the CLI fits the router
over the 30-config portfolio, reads the holdout once, writes a policy directory, and that
directory is what the Serve app's `PolicyRouter` loads and picks with, from features of the
real indexes. No Ray."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

from serving.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "synthetic"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["router", "train", "--out", str(out)]) == 0
    return out, json.loads((out / "report.json").read_text()), err.getvalue()


def test_the_report_compares_the_router_with_both_static_baselines(trained):
    out, rep, _ = trained
    assert rep["n"] == {"train": 60, "valid": 60, "test": 120}  # valid halves, then test
    assert len(rep["arms"]) == 30 and rep["arms"][0] == "static-default"
    by = {(r["system"], r["metric"]): r for r in rep["rows"]}
    for other in ("best-static", "static-default"):
        for metric in ("delta_reward", "delta_quality", "delta_cost_pct"):
            r = by[(f"supervised-router - {other}", metric)]
            assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["n"] == 120
    # a delta is the difference of the two systems' own means
    for metric, delta in (("reward", "delta_reward"), ("quality", "delta_quality")):
        d = by[("supervised-router", metric)]["value"] - by[("best-static", metric)]["value"]
        assert by[("supervised-router - best-static", delta)]["value"] == pytest.approx(d)
    gain = by[("supervised-router - best-static", "delta_reward")]
    assert rep["verdict"] == ("router" if gain["ci_low"] > 0 else "best-static")
    assert sum(rep["test_choices"].values()) == 120
    assert rep["best_static"] in rep["arms"]
    # chosen by cross-validation over train ∪ valid (120 queries: no small-data warning)
    assert rep["router"]["selection"] == "cv" and rep["warnings"] == []
    assert rep["router"]["static_arm"] in rep["arms"] and rep["router"]["margin"] >= 0
    md = (out / "report.md").read_text()
    assert "supervised-router - best-static" in md and "Verdict" in md


def test_the_directory_is_what_the_serve_app_loads_and_picks_with(trained):
    from rl.common.data import TuningData
    from rl.routing.base import load_policy
    from rl.routing.features import FEATURE_NAMES, QueryFeaturizer
    from serving.launch import read_serve_yaml
    from serving.policy_router import PolicyRouter
    from serving.schemas import ServeSettings

    out, rep, _ = trained
    # the serve.yaml written beside it deploys this directory in policy mode
    s = ServeSettings.from_args(read_serve_yaml(out / "serve.yaml")[1][0]["args"])
    assert s.traffic.mode == "policy" and s.policy.dir == str(out.resolve())
    loaded = load_policy(s.policy.dir)
    assert loaded.kind == "router" and loaded.names == rep["arms"]
    assert loaded.feature_names == list(FEATURE_NAMES)
    data = TuningData.open("synthetic")
    test = data.examples("test")
    # the greedy choices on the holdout are the report's
    X = QueryFeaturizer(data.indexes, loaded.base_config).matrix(test).astype(np.float64)
    greedy = loaded.policy.act(X)
    names, counts = np.unique([loaded.names[j] for j in greedy], return_counts=True)
    assert dict(zip(names.tolist(), counts.tolist(), strict=True)) == rep["test_choices"]
    # served: ε-exploration around that greedy choice, from the same features
    router = PolicyRouter(loaded, data.indexes, seed=0)
    picks = [router.pick(e.question) for e in test[:20]]
    assert [p.greedy_arm for p in picks] == greedy[:20].tolist()
    assert all(p.propensity >= router.epsilon / len(loaded.names) for p in picks)


def test_each_stage_says_what_it_did_on_stderr(trained):
    """A cold run on real data computes rows for minutes (MTRAG: 85 arms); the CLI says what it
    is doing: the data, the rows, the features and the router's cross-validation."""
    from rl.routing.router import PARAM_GRID

    _, rep, err = trained
    lines = [x for x in err.splitlines() if not x.startswith("[")]  # not rag.progress's
    assert lines[0] == ("policy data synthetic: 30 arms; queries train 60 (valid), valid 60 "
                        "(valid), test 120 (test)")
    assert any(line.startswith("  rows valid: 120 queries × 30 arms (") for line in lines)
    assert any(line.startswith("  rows: 30 arms × 240 queries (") for line in lines)
    assert any(line.startswith("  features: 42 per query (") for line in lines)
    cv = [line for line in lines if " parameter sets cross-validated, best CV reward" in line]
    n = len(PARAM_GRID)
    assert [line.split()[1] for line in cv] == [f"{i}/{n}" for i in range(1, n + 1)]
    chosen = next(line for line in lines if line.startswith("  router: margin "))
    assert f"over `{rep['router']['static_arm']}`" in chosen
    assert f"CV reward {rep['router']['cv_reward']:.4f}" in chosen


def test_rows_are_computed_only_for_the_queries_asked(tmp_path, monkeypatch):
    """`split_matrices(idx=...)`: a role's subset (e.g. `--max-train`) computes only its
    queries' rows, not the whole split's; progress lines come at most every PROGRESS_S."""
    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator
    from rl.kernel.settings import TunerSettings
    from rl.routing import train
    from rl.routing.portfolio import portfolio

    settings = TunerSettings.defaults()
    ev = TunerEvaluator(TuningData.open("synthetic"), settings, cache_root=tmp_path)
    configs = [c for _, c in portfolio(settings)[:3]]
    monkeypatch.setattr(train, "PROGRESS_S", 0.0)
    said = []
    M = train.split_matrices(ev, configs, "valid", np.array([1, 4]), said.append)
    assert M["R"].shape == (120, 3)
    computed = np.flatnonzero(np.isfinite(M["T"]).all(axis=1))
    assert computed.tolist() == [1, 4]
    assert said[0].startswith("  rows valid: 2 queries × 3 arms (the first arm loads the "
                              "indexes")
    assert [re.sub(r"\(\d+ s\)", "(t)", m) for m in said[1:]] == [
        "  rows valid: 1/3 arms (t)", "  rows valid: 2/3 arms (t)"]
    full = train.split_matrices(ev, configs, "valid")
    np.testing.assert_array_equal(full["R"][[1, 4]], M["R"][[1, 4]])


def test_a_second_run_into_the_same_directory_is_refused_and_keeps_the_policy(trained, capsys):
    out, _, _ = trained
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["router", "train", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--overwrite" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_overwrite_removes_the_policy_files_and_nothing_else(tmp_path):
    from rl.routing.train import POLICY_RUN_FILES, claim_policy_directory

    for name in POLICY_RUN_FILES:
        (tmp_path / name).write_text("old")
    (tmp_path / "ppo").unlink()
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "run.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    claim_policy_directory(tmp_path, overwrite=False, resumable=True)  # a resumed PPO run
    assert (tmp_path / "policy.json").exists()
    claim_policy_directory(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    claim_policy_directory(tmp_path, overwrite=False)  # nothing trained there now: no error
