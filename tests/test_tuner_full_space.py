"""The baselines on the full config space (issue 18, > 10^6 configs) on the synthetic world:
random, Optuna (TPE, define-by-run) and the bandits sample it and keep their budgets; the
exhaustive grid refuses it with the space's size."""

import pytest

from rag.errors import ConfigError
from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.baselines import bandit_search, grid_search, optuna_search, random_search


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    policy = TunerSettings.defaults().with_overrides(episode={"length": 4, "batch_size": 20})
    return TunerEvaluator(TuningData.open("synthetic"), policy,
                          cache_root=tmp_path_factory.mktemp("tuner"))


def test_baselines_search_the_full_space(ev):
    space = ConfigSpace(ev.policy)
    assert space.size() >= 10**6
    with pytest.raises(ConfigError, match="grid"):
        grid_search(ev)
    seen = set()
    for res in (random_search(ev, 4, seed=2), optuna_search(ev, 4, seed=2),
                bandit_search(ev, 4, seed=2, kind="ucb")):
        assert res.evaluations == 4 == len(res.curve), res.method
        # the answer is a config of the space (to_params raises otherwise)
        assert space.from_params(space.to_params(res.best_config)) == res.best_config
        seen |= {c["config_hash"] for c in res.curve}
    assert len(seen) > 4  # the searchers reach configs beyond one shared handful


def test_optuna_warm_start_on_the_full_space(ev):
    base = ev.policy.base_config()
    res = optuna_search(ev, 3, seed=0, unit="configs", start=base)
    assert res.curve[0]["config_hash"] == base.config_hash
