"""bench/policy.py's comparison rows on toy matrices (no evaluation runs)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.policy import _delta_rows


def _rows(ch):
    R = np.array([[0.5, 1.0], [0.5, 0.0], [0.5, 1.0], [0.5, 0.0]])
    M = {"R": R, "Q": R + 0.1, "T": np.tile([100.0, 150.0], (4, 1))}
    oracle = np.argmax(R, axis=1)
    return {(r["system"], r["metric"]): r for r in _delta_rows("toy", "x", M, np.asarray(ch), 0,
                                                                oracle, seed=0)}


def test_a_system_that_matches_the_oracle_captures_all_headroom():
    rows = _rows([1, 0, 1, 0])
    assert rows[("x", "headroom_captured")]["value"] == pytest.approx(1.0)
    assert rows[("x - best-static", "delta_reward")]["value"] == pytest.approx(0.25)
    assert rows[("x - best-static", "delta_quality")]["value"] == pytest.approx(0.25)
    # two of four queries move to the 150-token arm: +25% mean tokens
    assert rows[("x - best-static", "delta_cost_pct")]["value"] == pytest.approx(25.0)


def test_the_static_choice_captures_nothing():
    rows = _rows([0, 0, 0, 0])
    r = rows[("x", "headroom_captured")]
    assert r["value"] == 0.0 and r["ci_low"] == 0.0 and r["ci_high"] == 0.0
    assert rows[("x - best-static", "delta_cost_pct")]["value"] == 0.0


def test_equal_quality_oracle_takes_the_cheapest_arm_that_keeps_quality():
    from bench.policy import equal_quality_oracle

    # arm 0 (best static, 100 tokens); arm 1 (50 tokens) keeps quality on queries 0 and 1
    T = {"Q": np.array([[0.5, 0.5], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
         "T": np.tile([100.0, 50.0], (4, 1)), "R": np.zeros((4, 2))}
    got = equal_quality_oracle(T, base=0, seed=0)
    # query 3: both arms score 0, so the cheaper one keeps quality too: 3 of 4 at 50 tokens
    assert got["delta_cost_pct"] == pytest.approx(100 * (62.5 / 100 - 1))


def testwarm_starts_fall_back_to_the_best_arm_within_a_tighter_budget():
    from bench.policy import warm_starts

    from rag.config import RAGConfig

    configs = [(f"a{i}", RAGConfig(k=i + 1)) for i in range(3)]
    R = np.array([[0.9, 0.5, 0.6], [0.9, 0.5, 0.6]])
    T = np.array([[300.0, 100.0, 200.0], [300.0, 100.0, 200.0]])
    router = {"supervised-router": np.array([2, 1])}
    full = warm_starts(["best-static", "supervised-router"], configs, 0, R, T, 300.0, router)
    assert full[0].name == "best-static:a0" and full[0].targets(2)[0].k == 1
    assert [c.k for c in full[1].targets(2)] == [3, 2]
    tight = warm_starts(["best-static"], configs, 0, R, T, 250.0, router)
    assert tight[0].name == "best-static:a2"  # a0 is over budget; a2 beats a1 within it
    with pytest.raises(ValueError, match="unknown warm start"):
        warm_starts(["nope"], configs, 0, R, T, 300.0, router)


def test_ppo_flags_parse_into_a_grid_and_bad_values_exit_2(capsys):
    import argparse

    from bench.policy import _ppo_run

    ns = argparse.Namespace(ppo_warm="best-static", ppo_grid="lr=3e-4,1e-3;entropy_coeff=0,0.01",
                            ppo_budget_scales="1.0,0.75", ppo_base="router")
    run = _ppo_run(ns)
    assert run.warm == ("best-static",) and run.budget_scales == (1.0, 0.75)
    assert run.base == "router"
    # the default warm starts follow the base: defer to the router, or clone it
    assert _ppo_run(argparse.Namespace(**{**vars(ns), "ppo_warm": None})).warm == (
        "best-static", "defer-to-router")
    assert "defer-to-router" not in _ppo_run(argparse.Namespace(
        **{**vars(ns), "ppo_warm": None, "ppo_base": "none"})).warm
    assert len(run.grid) == 4 and {"lr": 1e-3, "entropy_coeff": 0.0} in run.grid
    for bad in ({"ppo_grid": "lr=-1"}, {"ppo_warm": "oracle"}, {"ppo_budget_scales": "0"},
                {"ppo_base": "bandit"},
                {"ppo_warm": "defer-to-router", "ppo_base": "none"}):
        with pytest.raises(SystemExit) as e:
            _ppo_run(argparse.Namespace(**{**vars(ns), **bad}))
        assert e.value.code == 2
    assert "--ppo-grid" in capsys.readouterr().err


class _Ex:
    def __init__(self, id_, meta=None):
        self.id, self.metadata = id_, meta


class _Data:
    def __init__(self, splits):
        self._s = splits
        self.splits = list(splits)

    def examples(self, split):
        return self._s[split]


class _Slice:
    tune_split, holdout_split = "valid", "test"


class _Ev:
    def __init__(self, splits):
        self.data, self.slice = _Data(splits), _Slice()


def _mtrag_like():
    """Three splits; conversations c0..c9 with 1-4 turns each, some spread over splits."""
    rng = np.random.default_rng(3)
    splits = {"train": [], "valid": [], "test": []}
    for c in range(10):
        for t in range(1 + c % 4):
            splits[["train", "valid", "test"][rng.integers(3)]].append(_Ex(f"c{c}<::>{t + 1}"))
    return _Ev(splits)


def test_crossfit_folds_test_every_query_once_and_keep_conversations_together():
    from bench.policy import crossfit_parts

    from rag.types import conversation_of

    ev = _mtrag_like()
    folds = crossfit_parts(ev, 4, seed=0)
    assert len(folds) == 4
    everyone = {(s, i) for s in ev.data.splits for i in range(len(ev.data.examples(s)))}
    tested: list[tuple[str, int]] = []
    for f, parts in enumerate(folds):
        roles = {r: {(s, int(i)) for s, idx in parts[r] for i in idx} for r in parts}
        assert roles["train"] | roles["valid"] | roles["test"] == everyone
        assert not (roles["train"] & roles["valid"] or roles["train"] & roles["test"]
                    or roles["valid"] & roles["test"])
        # valid is the next fold's test: fold f+1 (mod k)
        nxt = {(s, int(i)) for s, idx in folds[(f + 1) % 4]["test"] for i in idx}
        assert roles["valid"] == nxt
        conv = {r: {conversation_of(ev.data.examples(s)[i]) for s, i in q}
                for r, q in roles.items()}
        assert not (conv["train"] & conv["test"] or conv["valid"] & conv["test"]
                    or conv["train"] & conv["valid"])
        tested += sorted(roles["test"])
    assert sorted(tested) == sorted(everyone)  # each query tested exactly once
    sizes = [sum(len(idx) for _, idx in p["test"]) for p in folds]
    assert max(sizes) - min(sizes) <= 4  # dealt to the emptiest fold: within one conversation
    assert crossfit_parts(ev, 4, seed=0)[2]["test"][0][1].tolist() == folds[2]["test"][0][1].tolist()


def test_crossfit_refuses_too_few_folds_or_conversations_and_bad_flags(capsys):
    from bench.policy import _crossfit, crossfit_parts

    with pytest.raises(ValueError, match="k >= 3"):
        crossfit_parts(_mtrag_like(), 2, seed=0)
    with pytest.raises(ValueError, match="2 conversations cannot fill 3 folds"):
        crossfit_parts(_Ev({"valid": [_Ex("a<::>1")], "test": [_Ex("b<::>1"), _Ex("b<::>2")]}),
                       3, seed=0)
    assert _crossfit("mtrag=5,scifact=4") == {"mtrag": 5, "scifact": 4}
    assert _crossfit("none") == {}
    for bad in ("mtrag=2", "mtrag", "mtrag=x"):
        with pytest.raises(SystemExit) as e:
            _crossfit(bad)
        assert e.value.code == 2
    assert "--crossfit" in capsys.readouterr().err


def test_pooled_rows_use_each_folds_own_best_static():
    """Cross-fitted rows are over the folds' concatenated per-query arrays: a system equal to
    each fold's best static gains exactly 0 even though the folds chose different arms."""
    from bench.policy import system_rows

    a = {"R": np.array([0.5, 0.6]), "Q": np.array([0.5, 0.6]), "T": np.array([10.0, 10.0])}
    b = {"R": np.array([0.2, 0.9]), "Q": np.array([0.3, 0.9]), "T": np.array([20.0, 40.0])}
    cat = {k: np.concatenate([a[k], b[k]]) for k in a}
    better = {k: v + (0.1 if k != "T" else 0.0) for k, v in cat.items()}
    got = {"best-static": cat, "static-default": cat, "supervised-router": better,
           "supervised-router-equal-cost": cat, "per-segment-best": cat,
           "per-query-oracle": {k: v + (0.2 if k != "T" else 0.0) for k, v in cat.items()}}
    rows = {(r["system"], r["metric"]): r for r in system_rows("toy", got, got[
        "per-query-oracle"]["R"], seed=0)}
    assert rows[("per-segment-best - best-static", "delta_reward")]["value"] == 0.0
    assert rows[("supervised-router - best-static", "delta_reward")]["value"] == pytest.approx(0.1)
    assert rows[("supervised-router", "headroom_captured")]["value"] == pytest.approx(0.5)
    assert rows[("best-static", "tokens")]["n"] == 4
    # a PPO system is compared with both routers: plain, and the one held to the budget
    got["ppo-policy"] = cat
    rows = {(r["system"], r["metric"]): r for r in system_rows("toy", got, got[
        "per-query-oracle"]["R"], seed=0)}
    assert rows[("ppo-policy - supervised-router", "delta_reward")]["value"] == \
        pytest.approx(-0.1)
    assert rows[("ppo-policy - supervised-router-equal-cost", "delta_reward")]["value"] == 0.0


def test_a_crossfit_dataset_that_is_not_run_exits_2(monkeypatch, capsys):
    import sys

    from bench.policy import main

    monkeypatch.setattr(sys, "argv", ["policy.py", "--datasets", "mtrag", "--crossfit",
                                      "mtrg=5", "--no-ppo"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    assert "['mtrg'] not among the datasets run (mtrag)" in capsys.readouterr().err
