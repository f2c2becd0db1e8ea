"""Concurrent Tune trials, the parts that need no Ray runtime: what a search reports does not
depend on the order in which concurrent trials report (the best config breaks reward ties by
trial creation, not arrival: `rl.tuner.ask_tell.summarise`), Tune's creation order is read from
the experiment tag, and the per-trial resources are checked before Ray starts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.tuner import tune_search as ts
from rl.tuner.ask_tell import TrialRecord, summarise
from rl.tuner.plan import SearchPlan

CONFIGS = {"a": RAGConfig(k=3), "b": RAGConfig(k=5), "c": RAGConfig(k=8)}


def _arrivals(order: tuple[str, ...], rewards: dict[str, tuple[float, ...]]) -> list:
    """Each trial's three rung results (25, 75, 120 queries), trial after trial in `order`."""
    out = []
    for tid in order:
        for i, r in enumerate(rewards[tid], 1):
            out.append((tid, {"config_hash": CONFIGS[tid[1]].config_hash, "reward": r,
                              "query_evals": (25, 75, 120)[i - 1], "full_fidelity": i == 3,
                              "rung_seconds": 0.5}))
    return out


def _summary(created: tuple[str, ...], order: tuple[str, ...], rewards) -> object:
    trials = [TrialRecord(t, CONFIGS[t[1]], {}) for t in created]
    return summarise("grid", 0, 360, (25, 75, 120), trials, _arrivals(order, rewards), 1.0)


TIE = {"ta": (0.5, 0.6, 0.7), "tb": (0.4, 0.5, 0.7), "tc": (0.3, 0.4, 0.6)}
"""ta and tb tie at full fidelity, tc is worse."""


def test_a_reward_tie_goes_to_the_earliest_created_trial_whatever_reported_first():
    in_order = _summary(("ta", "tb", "tc"), ("ta", "tb", "tc"), TIE)
    shuffled = _summary(("ta", "tb", "tc"), ("tb", "tc", "ta"), TIE)  # tb reports first
    assert in_order.best_config == shuffled.best_config == CONFIGS["a"]
    assert in_order.best_reward == shuffled.best_reward == pytest.approx(0.7)
    assert in_order.query_evals == shuffled.query_evals == 360
    assert in_order.seconds == shuffled.seconds == pytest.approx(9 * 0.5)
    # the curve follows arrival: the best so far after tb's full rung is tb's reward
    assert shuffled.curve[2]["best_full"] == pytest.approx(0.7)
    assert [p["query_evals"] for p in shuffled.curve] == [25, 75, 120, 145, 195, 240, 265,
                                                           315, 360]
    # the winner of a tie follows creation, not the config or the arrival
    assert _summary(("tb", "ta", "tc"), ("ta", "tb", "tc"), TIE).best_config == CONFIGS["b"]


def test_trials_keep_their_rungs_and_history_keeps_arrival_order():
    res = _summary(("ta", "tb", "tc"), ("tc", "ta", "tb"), TIE)
    assert [t.trial_id for t in res.trials] == ["ta", "tb", "tc"]
    assert [[r["reward"] for r in t.rungs] for t in res.trials] == [list(TIE[t]) for t in TIE]
    assert [t.query_evals for t in res.trials] == [120, 120, 120]
    assert [h["trial_id"] for h in res.history[:3]] == ["tc"] * 3
    assert [h["cum_query_evals"] for h in res.history] == [p["query_evals"] for p in res.curve]


def test_a_trial_stopped_early_never_becomes_the_incumbent():
    res = _summary(("ta", "tb"), ("ta", "tb"), {"ta": (0.9, 0.95), "tb": (0.1, 0.2, 0.3)})
    assert res.trials[0].full is None and res.best_config == CONFIGS["b"]
    assert res.best_reward == pytest.approx(0.3) and res.query_evals == 75 + 120
    none = _summary(("ta",), ("ta",), {"ta": (0.9,)})
    assert none.best_config is None and none.curve[-1]["best_full"] is None
    with pytest.raises(ValueError, match="no incumbent"):
        none.to_tune_result()


def test_a_nan_full_reward_is_never_the_incumbent():
    res = _summary(("ta", "tb"), ("ta", "tb"), {"ta": (0.5, 0.6, np.nan), "tb": (0.1, 0.2, 0.3)})
    assert res.best_config == CONFIGS["b"]


def test_creation_index_reads_the_experiment_tag():
    assert ts._creation_index(SimpleNamespace(experiment_tag="12_config=x"), 3) == 12
    assert ts._creation_index(SimpleNamespace(experiment_tag="7"), 3) == 7
    assert ts._creation_index(SimpleNamespace(experiment_tag="grid"), 3) == 3
    assert ts._creation_index(SimpleNamespace(), 5) == 5


def test_bad_trial_resources_are_a_config_error():
    ev = SimpleNamespace()  # the check comes before the evaluator is read
    for bad in ({"cpu": -1}, {"head": "all"}):
        with pytest.raises(ConfigError, match="resources_per_trial"):
            ts.tune_search(ev, None, SearchPlan("grid", budget=100),
                           options=ts.TuneOptions(resources_per_trial=bad))
    with pytest.raises(ConfigError, match="max_concurrent"):
        ts.tune_search(ev, None, SearchPlan("grid", budget=100),
                       options=ts.TuneOptions(max_concurrent=0))
