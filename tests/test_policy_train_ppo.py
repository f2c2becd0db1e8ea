"""`ragpilot router train --learner ppo` (issue 19: a user trains the PPO policy from the CLI and
serves it): on the synthetic world the command fits the router, trains the residual PPO policy
over it with real RLlib (1 seed, 2 iterations: the pipeline, not the policy's quality, is
under test here; bench/policy.py measures that), reads the holdout once against the router,
best static and the default, and writes a policy directory that the Serve app's policy replica
loads and picks with, from features of the real indexes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl.routing.train_ppo import ppo_verdict
from serving.cli import main

pytestmark = pytest.mark.ray

SYSTEMS = ("ppo-policy", "supervised-router-equal-cost", "best-static", "static-default")


ARGV = ["router", "train", "--learner", "ppo", "--ppo-seeds", "1", "--ppo-iters", "2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo")
    out = root / "synthetic"
    with pytest.MonkeyPatch.context() as mp:
        # $MLFLOW_TRACKING_URI wins over --mlflow-dir, and mlflow.set_tracking_uri exports it:
        # an earlier test's may still be set (setenv first, so the context restores it)
        mp.setenv("MLFLOW_TRACKING_URI", "")
        mp.delenv("MLFLOW_TRACKING_URI")
        assert main([*ARGV, "--out", str(out), "--mlflow-dir", str(root / "mlflow")]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_the_report_compares_ppo_with_the_router_and_both_static_baselines(trained):
    out, rep = trained
    assert rep["n"] == {"train": 60, "valid": 60, "test": 120}
    assert rep["systems"] == list(SYSTEMS)
    by = {(r["system"], r["metric"]): r for r in rep["rows"]}
    for other in SYSTEMS[1:]:
        for metric, own in (("delta_reward", "reward"), ("delta_quality", "quality")):
            r = by[(f"ppo-policy - {other}", metric)]
            assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["n"] == 120
            # a delta is the difference of the two systems' own means
            d = by[("ppo-policy", own)]["value"] - by[(other, own)]["value"]
            assert r["value"] == pytest.approx(d)
        assert by[(f"ppo-policy - {other}", "delta_cost_pct")]["n"] == 120
    # the router's own gain over best static is reported beside PPO's
    router = by[("supervised-router-equal-cost - best-static", "delta_reward")]
    d = by[("supervised-router-equal-cost", "reward")]["value"] - by[("best-static", "reward")][
        "value"]
    assert router["value"] == pytest.approx(d) and router["n"] == 120
    # the verdict follows its rule (tests/unit/test_ppo_verdict.py) from the rows, and says why
    vs_router = by[("ppo-policy - supervised-router-equal-cost", "delta_reward")]
    assert (rep["verdict"], rep["reason"]) == ppo_verdict(rep["rows"])
    assert f"PPO − router {vs_router['value']:+.4f}" in rep["reason"] or (
        rep["verdict"] == "best-static")
    ppo = rep["ppo"]
    assert ppo["seeds"] == [0] and ppo["chosen_seed"] == 0 and ppo["iters"] == 2
    assert "defer" in ppo["heads"] and 0.0 <= ppo["test_deferred"] <= 1.0
    # the router the policy defers to is held to best static's valid tokens
    assert rep["router"]["equal_cost"] and ppo["budget_tokens"] > 0
    assert sum(rep["test_choices"].values()) == 120
    assert ppo["warm_start"] in ("defer-to-router", f"best-static:{rep['best_static']}")
    assert (out / "ppo" / "seed0" / "policy" / "module.pt").is_file()
    md = (out / "report.md").read_text()
    assert "# Per-query PPO policy" in md and "ppo-policy - best-static" in md
    assert "| supervised-router-equal-cost - best-static |" in md
    assert "Verdict" in md and rep["reason"] in md


def test_each_seeds_iterations_are_in_mlflow(trained, monkeypatch):
    import mlflow

    out, rep = trained
    uri = f"sqlite:///{out.parent / 'mlflow' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # removed again after the test
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["ppo-policy"], output_format="list")
    assert [r.info.run_name for r in runs] == ["ppo-policy-synthetic-seed0"]
    hist = mlflow.MlflowClient().get_metric_history(runs[0].info.run_id, "charts/valid_reward")
    assert [m.step for m in hist] == [2]  # evaluated on valid at the last iteration


def test_resume_reuses_the_finished_seed_and_refuses_another_run(trained, capsys):
    out, rep = trained
    assert main([*ARGV, "--out", str(out), "--no-mlflow", "--resume"]) == 0
    again = json.loads((out / "report.json").read_text())
    assert again["ppo"]["per_seed"][0]["reused"] and not rep["ppo"]["per_seed"][0]["reused"]
    assert again["rows"] == rep["rows"]  # the same policy read the same holdout
    err = capsys.readouterr().err
    assert "router: reused" in err and "[ppo seed 0] finished before: reused" in err
    # other PPO settings: not the run these seeds belong to
    assert main([*ARGV[:-1], "3", "--out", str(out), "--no-mlflow", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "error: --resume: " in err and "ppo differ" in err
    assert json.loads((out / "report.json").read_text())["rows"] == rep["rows"]  # untouched


def test_the_directory_is_what_the_policy_replica_loads_and_picks_with(trained):
    from rl.common.data import TuningData
    from rl.routing.base import load_policy
    from rl.routing.features import QueryFeaturizer
    from rl.routing.ppo_serving import PPOPortfolioPolicy
    from serving.launch import read_serve_yaml
    from serving.policy_router import PolicyService
    from serving.schemas import ServeSettings

    out, rep = trained
    s = ServeSettings.from_args(read_serve_yaml(out / "serve.yaml")[1][0]["args"])
    assert s.traffic.mode == "policy" and s.policy.dir == str(out.resolve())
    loaded = load_policy(s.policy.dir)
    assert loaded.kind == "ppo" and isinstance(loaded.policy, PPOPortfolioPolicy)
    # the router's 30 arms first (what a deferral serves), then PPO's own greedy configs
    assert loaded.names[:30] == rep["arms"][:30]
    assert len(loaded.names) == rep["ppo"]["served_arms"] >= 30
    data = TuningData.open("synthetic")
    test = data.examples("test")
    X = QueryFeaturizer(data.indexes, loaded.base_config).matrix(test).astype(np.float64)
    pol = loaded.policy
    greedy = pol.act(X)
    # each holdout query is served PPO's own greedy config, or (off the arm list) the arm PPO
    # gives the most probability
    obs, base = pol.observe(X)
    want = [c.config_hash for c in pol.ppo.act(obs, base)]
    on_list = np.array([pol.arms[a].config_hash == w for a, w in zip(greedy, want, strict=True)])
    assert pol.off_list == int((~on_list).sum()) == rep["ppo"]["test_off_list"]
    assert on_list.mean() > 0.5
    # the report scored exactly these picks
    names, counts = np.unique([loaded.names[a] for a in greedy], return_counts=True)
    assert dict(zip(names.tolist(), counts.tolist(), strict=True)) == rep["test_choices"]
    # served by the policy replica body (what the Serve deployment runs), from the question
    svc = PolicyService(str(out), dataset="synthetic", seed=0, warmup=False)
    picks = [svc.router.pick(e.question) for e in test[:10]]
    assert [p.greedy_arm for p in picks] == greedy[:10].tolist()
    assert all(p.propensity > 0 for p in picks)
    ans = svc.answer(test[0].question)
    assert ans["variant_id"] == pol.arms[ans["policy"]["arm"]].config_hash and ans["answer"]


def test_the_directory_is_served_over_http_with_its_propensities_logged(trained, tmp_path):
    """The command's serve.yaml, deployed by the real Serve app (private network namespace,
    like tests/test_serve_policy.py): `/query` is answered by the PPO policy's arms, with the
    propensity of each pick logged beside the policy's id."""
    import sqlite3

    import httpx
    import ray

    from rl.common.data import TuningData
    from rl.routing.base import load_policy
    from serving import netns
    from serving.auth import KeyFile
    from serving.launch import read_serve_yaml, start_local, stop_local

    out, _ = trained
    if not netns.in_private_netns():
        if ray.is_initialized():  # RLlib's: a namespace is entered before Ray starts
            ray.shutdown()
        if not netns.enter_private_netns():
            print(f"serving test not isolated ({netns.last_error}); HTTP on 127.0.0.1 only")
    loaded = load_policy(out)
    hashes = [c.config_hash for c in loaded.policy.arms]
    store = tmp_path / "interactions.sqlite"
    token, _ = KeyFile(tmp_path / "keys.json").create("admin", name="test")
    args = {**read_serve_yaml(out / "serve.yaml")[1][0]["args"],
            "store_url": str(store), "auth": {"keys_file": str(tmp_path / "keys.json")},
            "limits": {"rate_per_s": 1000.0, "burst": 1000.0},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "rollout_dir": str(tmp_path / "rollout")}
    url = start_local(args, port=netns.free_port())
    got = []
    try:
        with httpx.Client(base_url=url, timeout=120.0, headers={"X-API-Key": token}) as client:
            for ex in TuningData.open("synthetic").examples("test")[:8]:
                r = client.post("/query", json={"question": ex.question})
                assert r.status_code == 200, r.text
                got.append(r.json())
    finally:
        stop_local()
    eps = loaded.epsilon
    for body in got:
        assert body["route"] == "policy" and body["variant_id"] in hashes and body["answer"]
        assert eps / len(hashes) - 1e-9 <= body["propensity"] <= 1.0
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT id, variant_id, propensity, policy_id, arm FROM "
                          "interactions WHERE route = 'policy'").fetchall()
    by_id = {r[0]: r for r in rows}
    for body in got:
        _, variant, prop, pid, arm = by_id[body["interaction_id"]]
        assert variant == body["variant_id"] == hashes[arm] and pid == loaded.policy_id
        assert prop == pytest.approx(body["propensity"])
