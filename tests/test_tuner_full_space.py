"""The searches on the full config space (> 10^6 configs) on the synthetic world: random, TPE,
HyperOpt and local-asha sample it and keep their budgets; the exhaustive grid refuses it with
the space's size."""

import pytest

from rag.errors import ConfigError
from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import exhaustive, run_search
from rl.tuner.plan import SearchPlan


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    return TunerEvaluator(TuningData.open("synthetic"), TunerSettings.defaults(),
                          cache_root=tmp_path_factory.mktemp("tuner"))


def test_searches_sample_the_full_space(ev):
    space = ConfigSpace(ev.policy)
    assert space.size() >= 10**6
    with pytest.raises(ConfigError, match="grid"):
        exhaustive(ev, space)
    seen = set()
    for method in ("random", "tpe", "hyperopt"):
        res = run_search(ev, space, SearchPlan(method, budget=2 * 120, seed=2), split="valid",
                         rungs=(25,))
        assert res.rungs == (120,) and len(res.trials) == 2, method  # full split each
        for t in res.trials:  # each trial is a config of the space (to_params raises else)
            assert space.from_params(space.to_params(t.config)) == t.config
        seen |= {t.config.config_hash for t in res.trials}
    res = run_search(ev, space, SearchPlan("local-asha", budget=4 * 25, seed=2))
    assert res.query_evals >= 100 and res.trials[0].rungs[0]["n"] == 25  # ASHA's first rung
    seen |= {t.config.config_hash for t in res.trials}
    assert len(seen) > 4  # the searchers reach configs beyond one shared handful


def test_warm_start_on_the_full_space(ev):
    base = ev.policy.base_config()
    res = run_search(ev, ConfigSpace(ev.policy), SearchPlan("tpe", budget=1, seed=0, start=base))
    assert res.trials[0].config.config_hash == base.config_hash
