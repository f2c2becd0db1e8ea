"""The search protocol on Ray Tune (rl.tuner.tune_search) on the synthetic world: every searcher
runs through tune.Tuner and answers with a full-fidelity incumbent, ASHA stops trials at the
first rung, the query budget holds, a seed fixes the search, the gate constraints reach Optuna,
and `rl.tuner.run.search` sends a search to Tune when Tune options are given.

A small pinned space (8 configs) whose tables are computed once in this process before any
search: trial processes only read the shared on-disk row cache."""

import pytest

from rag.errors import ConfigError
from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.reward import HARD_GATES
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import exhaustive
from rl.tuner.plan import SearchPlan
from rl.tuner.searchers import MULTI_FIDELITY, SEARCHERS
from rl.tuner.tune_search import TuneOptions, tune_search

pytestmark = pytest.mark.ray

RUNGS = (10, 30, None)  # the synthetic valid split has 120 queries
BUDGET = 600


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    policy = TunerSettings.defaults().with_overrides(
        k_grid=[3, 5], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off"],
                  "prompt_id": ["cite_concise"]}).with_legacy_space()  # the later heads pinned
    assert len(list(ConfigSpace(policy).grid())) == 8
    ev = TunerEvaluator(TuningData.open("synthetic"), policy,
                        cache_root=tmp_path_factory.mktemp("tune-cache"))
    grid = exhaustive(ev, ConfigSpace(policy))  # every table once, here
    return ev, ConfigSpace(policy), grid


@pytest.fixture(scope="module")
def runs(setup, tmp_path_factory):
    """method -> its search with seed 0 (run on first use, shared by the tests)."""
    ev, space, _ = setup
    root = tmp_path_factory.mktemp("tune-runs")
    done = {}

    def run(method, seed=0, budget=BUDGET, tag=""):
        key = (method, seed, budget, tag)
        if key not in done:
            done[key] = tune_search(ev, space, SearchPlan(method, budget, seed), rungs=RUNGS,
                                    options=TuneOptions(
                                        storage_path=root / f"{method}-{seed}{tag}"))
        return done[key]

    return run


@pytest.mark.parametrize("method", SEARCHERS)
def test_each_method_answers_with_a_full_fidelity_incumbent_within_budget(setup, runs, method):
    ev, _, grid = setup
    res = runs(method)
    n = len(ev.data.examples(ev.slice.tune_split))
    assert res.rungs == ((10, 30, n) if method in MULTI_FIDELITY else (n,))
    assert res.best_config is not None
    # the incumbent is the best reward among trials that reached the full split, and it is
    # the reward the driver's evaluator gives that config on the whole split
    full = [t for t in res.trials if t.full is not None]
    assert full and res.best_reward == pytest.approx(max(t.full["reward"] for t in full))
    assert ev.evaluate(res.best_config).reward == pytest.approx(res.best_reward)
    assert res.best_reward <= grid.best_reward + 1e-9
    # budget: counted in query-evaluations over all trials; no trial starts once spent
    assert res.query_evals == sum(t.query_evals for t in res.trials)
    assert BUDGET <= res.query_evals < BUDGET + n  # grid too: 5 of its 8 configs fit
    assert len(res.grid) == len(res.trials) and res.seconds > 0 and res.wall_s > 0
    assert all(t.node_id for t in res.trials)  # each trial names the Ray node it ran on
    # the curve: best full-fidelity reward so far against cumulative query-evals
    xs = [c["query_evals"] for c in res.curve]
    ys = [c["best_full"] for c in res.curve if c["best_full"] is not None]
    assert xs == sorted(xs) and xs[-1] == res.query_evals
    assert ys == sorted(ys) and ys[-1] == pytest.approx(res.best_reward)
    tr = res.to_tune_result()
    assert tr.best_config == res.best_config and tr.extra["query_evals"] == res.query_evals


def test_asha_stops_some_trials_at_the_first_rung(setup, runs):
    ev, _, _ = setup
    n = len(ev.data.examples(ev.slice.tune_split))
    for method in MULTI_FIDELITY:
        res = runs(method, budget=1200)
        spent = [t.query_evals for t in res.trials]
        assert set(spent) <= {10, 30, n}
        assert 10 in spent and res.query_evals < len(res.trials) * n
    # without a scheduler every trial runs to the full split
    assert all(t.query_evals == n for t in runs("tpe").trials)


@pytest.mark.parametrize("method", MULTI_FIDELITY)
def test_same_seed_same_search(runs, method):
    a, b = runs(method, seed=3), runs(method, seed=3, tag="-again")
    assert [t.config for t in a.trials] == [t.config for t in b.trials]
    assert [[r["reward"] for r in t.rungs] for t in a.trials] == \
        [[r["reward"] for r in t.rungs] for t in b.trials]
    assert a.best_reward == b.best_reward and a.query_evals == b.query_evals


def test_gate_violations_reach_the_optuna_trials(runs):
    from optuna.trial import TrialState

    res = runs("tpe-asha", budget=1200)
    study = res.searcher.searcher._ot_study  # inside the BudgetLimiter
    told = [t for t in study.trials if t.state != TrialState.RUNNING]
    assert len(told) == len(res.trials)  # every started trial finished its rungs
    for ot, trial in zip(told, res.trials, strict=True):
        last = trial.rungs[-1]
        assert ot.constraints == {g: pytest.approx(last[f"violation_{g}"]) for g in HARD_GATES}
        # a trial stopped below the full split is pruned, with its last rung score: TPE does
        # not read its low-fidelity reward as a full-split one
        if trial.full is not None:
            assert ot.state == TrialState.COMPLETE
        else:
            assert ot.state == TrialState.PRUNED
            assert ot.intermediate_values[len(trial.rungs)] == pytest.approx(last["score"])
    assert any(ot.state == TrialState.PRUNED for ot in told)


def test_bad_requests_are_config_errors(setup, tmp_path):
    ev, space, _ = setup
    with pytest.raises(ConfigError, match="budget"):
        tune_search(ev, space, SearchPlan("tpe", budget=0), rungs=RUNGS,
                    options=TuneOptions(storage_path=tmp_path))
    with pytest.raises(ConfigError, match="method"):
        tune_search(ev, space, SearchPlan("bohb", budget=BUDGET),
                    options=TuneOptions(storage_path=tmp_path))


def test_the_tuning_run_sends_a_search_to_tune_when_asked(setup, tmp_path):
    from rl.tuner.run import check, search

    ev, _, _ = setup
    found = search(ev, ev.policy, SearchPlan("random", BUDGET, seed=1),
                   tune=TuneOptions(max_concurrent=1, storage_path=tmp_path))
    assert found.found.grid is not None  # Tune's ResultGrid: it ran on tune.Tuner
    res = found.result
    assert res.method == "random" and res.extra["query_evals"] >= BUDGET
    steps = found.history  # the rung evaluations, read from the trials' reports
    assert len(steps) == res.evaluations
    assert {"reward", "faithfulness", "relevancy", "p95_latency_ms", "cost",
            "config_hash", "query_evals"} <= set(steps[0])
    assert all(s["config_hash"] in ev.seen for s in steps)
    local = search(ev, ev.policy, SearchPlan("random", BUDGET, seed=1))
    assert local.found.grid is None  # no Tune options: in this process
    assert [s["config_hash"] for s in local.history] == [s["config_hash"] for s in steps]
    with pytest.raises(ConfigError, match="method"):
        check("tune-random", 100)
    with pytest.raises(ConfigError, match="resume"):  # it would be ignored: refused instead
        search(ev, ev.policy, SearchPlan("random", BUDGET), resume=tmp_path)


def test_the_default_method_is_the_default_searcher():
    from rl.tuner.plan import DEFAULT_SEARCHER
    from rl.tuner.run import DEFAULT_METHOD, METHODS
    from serving.demo.offline import SEARCHER

    assert DEFAULT_METHOD == DEFAULT_SEARCHER == SEARCHER
    assert len(METHODS) <= 6 and set(METHODS) - {"ppo"} <= set(SEARCHERS)


@pytest.mark.parametrize("method", ["tpe", "random"])
def test_start_config_is_the_first_trial(setup, tmp_path, method):
    ev, space, _ = setup
    res = tune_search(ev, space, SearchPlan(method, budget=240, seed=5, start=space.base),
                      rungs=RUNGS, options=TuneOptions(storage_path=tmp_path))
    assert res.trials[0].config.config_hash == space.base.config_hash
