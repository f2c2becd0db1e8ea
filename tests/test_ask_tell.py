"""The search protocol's in-process executor (`rl.tuner.ask_tell.run_search`) on a toy evaluator
whose rewards are known (the real evaluator runs under it in tests/test_search_real.py;
tests/test_search_executors.py compares it with the Tune executor): budget in
query-evaluations, rungs as prefixes, ASHA stopping, only full-fidelity incumbents,
determinism, and the gates reaching TPE as constraints."""

from types import SimpleNamespace

import numpy as np
import pytest
from ray import tune

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.tuner.ask_tell import run_search
from rl.tuner.fidelity import rung_indices, rungs_for
from rl.tuner.plan import SearchPlan
from rl.tuner.searchers import MULTI_FIDELITY, SEARCHERS

N = 120


class ToySpace:
    def tune_param_space(self):
        return {"w": tune.quniform(0.0, 1.0, 0.05), "variant": tune.choice(["hybrid", "bm25"])}

    def from_params(self, p):
        return RAGConfig(variant=p["variant"], fusion_weight=round(float(p["w"]), 2))

    def to_params(self, c, complete=False):
        return {"w": c.fusion_weight, "variant": c.variant}

    def sample(self, rng):
        return self.from_params({"w": rng.uniform(0, 1), "variant": ["hybrid", "bm25"][
            rng.integers(2)]})


class ToyEvaluator:
    """reward = 1 - (w - 0.7)^2 (hybrid) or 0.5 (bm25), plus query noise that shrinks with n."""

    def __init__(self):
        self.data = SimpleNamespace(examples=lambda split: list(range(N)))
        self.slice = SimpleNamespace(tune_split="valid")
        self.asked: list[tuple[str, int]] = []
        noise = np.random.default_rng(0).normal(0, 0.2, N)
        self.noise = noise - noise.mean()

    def reward_spec(self):
        from rl.kernel.reward import RewardSpec
        from rl.kernel.settings import Thresholds, TunerSettings

        return RewardSpec.from_settings(TunerSettings.defaults(), Thresholds())

    def _true(self, cfg):
        return 1 - (cfg.fusion_weight - 0.7) ** 2 if cfg.variant == "hybrid" else 0.5

    def evaluate(self, cfg, split, idx):
        idx = np.asarray(idx)
        self.asked.append((cfg.config_hash, len(idx)))
        r = self._true(cfg) + float(self.noise[idx].mean())
        return SimpleNamespace(reward=r, faithfulness=r, relevancy=r, cost=100.0, n=len(idx),
                               p95_latency_ms=10.0, quality_se=0.01,
                               config_hash=cfg.config_hash,
                               gates={"faithfulness": r >= 0.8, "relevancy": True,
                                      "p95_latency_ms": True, "stable": len(idx) > 50,
                                      "passed": r >= 0.8},
                               violations={"faithfulness": 0.8 - r, "relevancy": -1.0,
                                           "p95_latency_ms": -1.0})

    def table(self, cfg, split, idx=None):
        return {"latency_ms": np.full(N, 10.0)}


def test_rungs_are_prefixes_of_one_permutation():
    assert rungs_for(300, (25, 75, None)) == [25, 75, 300]
    assert rungs_for(60, (25, 75, None)) == [25, 60]
    a, b = rung_indices(300, 25), rung_indices(300, 75)
    assert np.array_equal(b[:25], a) and len(set(b)) == 75


@pytest.mark.parametrize("method", [m for m in SEARCHERS if m != "grid"])
def test_every_method_respects_the_budget_and_returns_a_full_fidelity_incumbent(method):
    ev = ToyEvaluator()
    res = run_search(ev, ToySpace(), SearchPlan(method, budget=8 * N, seed=1))
    assert res.query_evals >= 8 * N and res.query_evals < 8 * N + N  # one trial may finish
    assert res.query_evals == sum(p2 - p1 for p1, p2 in zip(
        [0] + [p["query_evals"] for p in res.curve][:-1], [p["query_evals"] for p in res.curve],
        strict=True))
    full = [t for t in res.trials if t.full is not None]
    assert full and res.best_reward == max(t.full["reward"] for t in full)
    assert res.curve[-1]["seconds"] == pytest.approx(res.query_evals * 10.0 / 1000)
    if method in MULTI_FIDELITY:
        # ASHA stops trials at the first rung: more trials than full-split evaluations buy
        assert len(res.trials) > 8 and any(len(t.rungs) == 1 for t in res.trials)
        assert {n for _, n in ev.asked} == {25, 75, N}
    else:
        assert {n for _, n in ev.asked} == {N}


def test_same_seed_same_sequence_and_different_seed_differs():
    runs = [run_search(ToyEvaluator(), ToySpace(), SearchPlan("tpe-asha", budget=10 * N, seed=s))
            for s in (4, 4, 5)]
    seq = [[(t.config.config_hash, [r["reward"] for r in t.rungs]) for t in r.trials]
           for r in runs]
    assert seq[0] == seq[1] and seq[0] != seq[2]


def test_tpe_gets_the_gates_as_constraints_and_a_start_point():
    from rl.tuner import ask_tell

    made = {}
    real = ask_tell.make_searcher

    def spy(*a, **kw):
        made["s"] = real(*a, **kw)
        return made["s"]

    ask_tell.make_searcher = spy
    try:
        start = RAGConfig(variant="hybrid", fusion_weight=0.7)
        res = run_search(ToyEvaluator(), ToySpace(),
                         SearchPlan("tpe", budget=6 * N, seed=0, start=start))
    finally:
        ask_tell.make_searcher = real
    assert res.trials[0].config.config_hash == start.config_hash
    study = made["s"].searcher._ot_study  # inside the ConcurrencyLimiter
    cons = [t.constraints for t in study.trials if t.state.is_finished()]
    assert cons and all(len(c) == 3 for c in cons)
    # a trial's score is its reward without the instability term (stable only above 50 here)
    assert cons[0]["relevancy"] == cons[0]["p95_latency_ms"] == -1.0
    assert cons[0]["faithfulness"] == pytest.approx(0.8 - res.trials[0].rungs[-1]["reward"])


def test_rung_scores_leave_out_the_instability_term():
    res = run_search(ToyEvaluator(), ToySpace(), SearchPlan("tpe-asha", budget=6 * N, seed=2))
    lam = ToyEvaluator().reward_spec().weights.lambda_
    for t in res.trials:
        for r in t.rungs:
            want = r["reward"] + (0.5 * lam if r["n"] <= 50 else 0.0)
            assert r["score"] == pytest.approx(want)


def test_search_finds_the_toy_optimum_region():
    res = run_search(ToyEvaluator(), ToySpace(), SearchPlan("tpe-asha", budget=40 * N, seed=0))
    assert res.best_config.variant == "hybrid" and abs(res.best_config.fusion_weight - 0.7) <= 0.2


def test_local_search_starts_from_the_start_point_and_finds_the_toy_optimum():
    start = RAGConfig(variant="bm25", fusion_weight=0.5)
    res = run_search(ToyEvaluator(), ToySpace(),
                     SearchPlan("local-asha", budget=20 * N, seed=0, start=start))
    assert res.trials[0].config.config_hash == start.config_hash
    assert res.best_config.variant == "hybrid" and abs(res.best_config.fusion_weight - 0.7) <= 0.1
    hashes = [t.config.config_hash for t in res.trials][:30]  # the space has 42 configs
    assert len(hashes) == 30 and len(set(hashes)) == 30  # no config is suggested twice


def test_grid_scores_every_config_once_and_stops():
    class GridSpace(ToySpace):
        def grid(self):
            return iter([RAGConfig(variant=v, fusion_weight=w) for v in ("hybrid", "bm25")
                         for w in (0.3, 0.7)])

    ev = ToyEvaluator()
    res = run_search(ev, GridSpace(), SearchPlan("grid", budget=100 * N, seed=0))
    assert len(res.trials) == 4 and res.query_evals == 4 * N  # the grid ended the search
    assert res.best_config == RAGConfig(variant="hybrid", fusion_weight=0.7)


def test_bad_requests_are_config_errors():
    with pytest.raises(ConfigError, match="method"):
        run_search(ToyEvaluator(), ToySpace(), SearchPlan("bohb", budget=N))
    with pytest.raises(ConfigError, match="budget"):
        run_search(ToyEvaluator(), ToySpace(), SearchPlan("tpe", budget=0))
    with pytest.raises(ConfigError, match="budget"):  # a plan's default budget is run_tuning's
        run_search(ToyEvaluator(), ToySpace(), SearchPlan("tpe"))
