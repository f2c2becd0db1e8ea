"""One search protocol, two executors: the same seed and space driven in this process
(`rl.tuner.ask_tell.run_search`) and on `tune.Tuner` (`rl.tuner.tune_search.tune_search`, one
trial at a time) give the same trials (configs and rungs, in order), the same query-evaluations
and the same best config.

A small pinned space on the synthetic world (12 configs), its tables computed once in this
process before any search: Tune's trial processes only read the shared on-disk row cache."""

import pytest

from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import exhaustive, run_search
from rl.tuner.plan import SearchPlan
from rl.tuner.tune_search import TuneOptions, tune_search

pytestmark = pytest.mark.ray

RUNGS = (10, 30, None)  # the synthetic valid split has 120 queries
BUDGET = 700


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    settings = TunerSettings.defaults().with_overrides(
        k_grid=[3, 5, 8], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off"],
                  "prompt_id": ["cite_concise"]}).with_legacy_space()  # the later heads pinned
    space = ConfigSpace(settings)
    ev = TunerEvaluator(TuningData.open("synthetic"), settings,
                        cache_root=tmp_path_factory.mktemp("exec-cache"))
    grid = exhaustive(ev, space)  # every table once, here
    assert len(grid.trials) == space.size() == 12
    return ev, space


def _sequence(res):
    return [(t.config.config_hash, [(r["n"], r["reward"]) for r in t.rungs])
            for t in res.trials]


@pytest.mark.parametrize("method", ["local-asha", "tpe"])
def test_both_executors_give_the_same_trials_and_best_config(setup, tmp_path, method):
    ev, space = setup
    start = space.base
    plan = SearchPlan(method, BUDGET, seed=3, start=start)
    local = run_search(ev, space, plan, rungs=RUNGS)
    on_tune = tune_search(ev, space, plan, rungs=RUNGS,
                          options=TuneOptions(storage_path=tmp_path))
    assert len(local.trials) >= 5
    assert _sequence(on_tune) == _sequence(local)
    assert on_tune.query_evals == local.query_evals >= BUDGET
    assert on_tune.best_config == local.best_config is not None
    assert on_tune.best_reward == local.best_reward
    assert [p["query_evals"] for p in on_tune.curve] == [p["query_evals"] for p in local.curve]
    if method == "local-asha":  # ASHA stopped some trials below the full split
        assert any(len(t.rungs) < 3 for t in local.trials)
