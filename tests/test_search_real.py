"""The default searcher (TPE + ASHA over fidelity rungs, `rl.tuner.ask_tell`) on the real tuner
evaluator and the full config space, synthetic world: rungs cost only their new queries, the
incumbent is a full-split result, and the same seed twice (fresh row caches, the run's stored
cost model) gives the same trials and identical rewards."""

import numpy as np
import pytest

from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import run_search
from rl.tuner.fidelity import rung_indices
from rl.tuner.plan import SearchPlan


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


def test_default_searcher_on_the_real_evaluator_is_deterministic(data, tmp_path):
    settings = TunerSettings.defaults()
    space = ConfigSpace(settings)
    assert space.size() >= 10**6
    model = tmp_path / "cost-model.json"
    n = len(data.examples("valid"))
    results = []
    for run in ("a", "b"):
        ev = TunerEvaluator(data, settings, cache_root=tmp_path / run, cost_model=model)
        res = run_search(ev, space, SearchPlan("tpe-asha", budget=4 * n, seed=7,
                                                    start=settings.base_config()))
        results.append(res)
        # every row computed was asked for: rungs are prefixes, promotions pay only new rows
        assert ev.counters["queries_computed"] <= res.query_evals
        assert res.best_config is not None
        full = [t for t in res.trials if t.full is not None]
        assert res.best_reward == max(t.full["reward"] for t in full)
        assert ev.evaluate(res.best_config, "valid").reward == res.best_reward
        assert any(len(t.rungs) < len(full[0].rungs) for t in res.trials)  # ASHA stopped some
    a, b = ([(t.config.config_hash, [r["reward"] for r in t.rungs]) for t in r.trials]
            for r in results)
    assert a == b
    assert results[0].trials[0].config.config_hash == settings.base_config().config_hash
    first = results[0].trials[0].rungs[0]
    assert first["n"] == 25 and np.array_equal(rung_indices(n, 25), rung_indices(n, 25))
