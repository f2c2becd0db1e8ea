"""The tuner's evaluation path on the synthetic world with the real stack (tantivy, FAISS,
MiniLM, graph, extractive reader): cached per-query tables, the env, the baselines."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rag.errors import ConfigError
from rl.baselines import bandit_search, grid_search, optuna_search, random_search
from rl.env import TunerEnv
from rl.evaluation import TunerEvaluator, TuningData
from rl.policy import PolicyConfig
from rl.reward import StepMetrics, reward
from rl.space import ConfigSpace


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


@pytest.fixture(scope="module")
def small_policy():
    # a small space keeps the module fast: 2 retrievers x 3 k x rerank x 1 prompt (+3 weights);
    # fusion_step = fusion_grid so every config an action can reach is in the grid
    return PolicyConfig.defaults().with_overrides(
        k_grid=[3, 5, 8], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off", "on"],
                  "prompt_id": ["cite_concise"]},
        episode={"length": 4, "batch_size": 40})


@pytest.fixture(scope="module")
def ev(data, small_policy, tmp_path_factory):
    return TunerEvaluator(data, small_policy, cache_root=tmp_path_factory.mktemp("tuner"))


def test_splits_are_disjoint_and_nonempty(data):
    valid = {e.id for e in data.examples("valid")}
    test = {e.id for e in data.examples("test")}
    assert valid and test and not valid & test
    with pytest.raises(ConfigError, match="split"):
        data.examples("nope")


def test_evaluate_report_is_consistent_and_cached_on_disk(data, small_policy, ev, tmp_path):
    cfg = ConfigSpace(small_policy).base
    first = ev.evaluate(cfg)
    assert not first.cached and first.n == len(data.examples("valid"))
    again = ev.evaluate(cfg)
    assert again.cached and again.reward == first.reward
    assert again.p95_latency_ms == first.p95_latency_ms  # latency comes from stored costs
    # the reward is the pure reward function of the report's own numbers
    r, _ = reward(StepMetrics(first.faithfulness, first.relevancy, first.p95_latency_ms,
                              first.cost, first.quality_se), small_policy.reward_weights,
                  ev.thresholds, small_policy.cost_ref_tokens, small_policy.instability_band)
    assert r == pytest.approx(first.reward)
    assert 0 < first.faithfulness <= 1 and 0 <= first.relevancy <= 1 and first.cost > 0
    assert first.p50_latency_ms <= first.p95_latency_ms
    # a fresh evaluator on the same cache directory computes nothing
    fresh = TunerEvaluator(data, small_policy, cache_root=ev.root)
    rep = fresh.evaluate(cfg)
    assert rep.cached and rep.reward == first.reward and fresh.counters["tables_computed"] == 0
    # a batch is a subset of the table: its mean F equals the mean over those rows
    idx = np.arange(0, first.n, 3)
    sub = ev.evaluate(cfg, idx=idx)
    tab = ev.table(cfg, "valid")
    assert sub.n == idx.size
    assert sub.faithfulness == pytest.approx(np.nanmean(tab["support"][idx]))


def test_more_context_costs_more_tokens(ev, small_policy):
    space = ConfigSpace(small_policy)
    small = ev.evaluate(space.make("bm25", 3, "off", 0.5, "cite_concise"))
    big = ev.evaluate(space.make("bm25", 8, "off", 0.5, "cite_concise"))
    assert big.cost > 1.5 * small.cost
    assert big.metrics["recall@k"] >= small.metrics["recall@k"]


def test_env_passes_gymnasium_checks_and_steps(ev):
    env = TunerEnv({"seed": 3}, evaluator=ev)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    total, steps = 0, 0
    done = False
    while not done:
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        total += r
        steps += 1
        done = term or trunc
        assert env.observation_space.contains(obs) and isinstance(info["gates_passed"], bool)
    assert steps == env.length == 4
    assert env.history[-1]["config"].config_hash == info["config_hash"]


def test_grid_is_the_ceiling_and_baselines_keep_budget(ev, small_policy):
    grid = grid_search(ev)
    rewards = grid.extra["rewards"]
    assert grid.evaluations == len(rewards) == len(list(ConfigSpace(small_policy).grid()))
    assert ev.evaluate(grid.best_config).reward == pytest.approx(max(rewards.values()))
    for res in (random_search(ev, 12, seed=1), optuna_search(ev, 12, seed=1),
                bandit_search(ev, 12, seed=1, kind="ucb"),
                bandit_search(ev, 12, seed=1, kind="thompson")):
        assert res.evaluations == 12 == len(res.curve), res.method
        # no static config on the full split beats the grid's best
        assert ev.evaluate(res.best_config).reward <= max(rewards.values()) + 1e-9


def test_offline_evaluator_replays_real_tables(ev, small_policy):
    """The rollout's offline gate on the real stack: paired per-query rewards from the tuner's
    tables; a config compared with itself has Δ = 0 exactly, and the report's Δ is the mean of
    the per-query reward differences."""
    from rl.evaluators import OfflineEvaluator

    off = OfflineEvaluator(ev, ci_method="normal")
    space = ConfigSpace(small_policy)
    stable = space.make("bm25", 3, "off", 0.5, "cite_concise")
    cand = space.make("hybrid", 8, "off", 0.5, "cite_concise")
    same = off.compare(stable, stable)
    assert same.kind == "offline" and same.paired and same.diff == 0.0
    rep = off.compare(stable, cand)
    split = ev.slice.tune_split
    want = (ev.per_query_reward(ev.table(cand, split))
            - ev.per_query_reward(ev.table(stable, split))).mean()
    assert rep.n == len(ev.data.examples(split)) and rep.diff == pytest.approx(want)
    assert rep.ci_low <= rep.diff <= rep.ci_high
    assert rep.meta["candidate_hash"] == cand.config_hash


def test_quality_scorer_metrics_can_play_f_and_r(data, small_policy, ev, tmp_path):
    """`q_` metrics come from the local RAGAS-compatible QualityScorer; its context recall is
    gold passages among the contexts, i.e. the gold-based recall@k of the same table."""
    pol = small_policy.with_overrides(datasets={"synthetic": {
        "faithfulness": "q_faithfulness", "relevancy": "q_answer_relevancy"}})
    qev = TunerEvaluator(data, pol, cache_root=tmp_path)
    assert qev.uses_quality and not ev.uses_quality
    cfg = ConfigSpace(pol).make("hybrid", 5, "off", 0.5, "cite_concise")
    rep = qev.evaluate(cfg)
    tab = qev.table(cfg, "valid")
    assert rep.faithfulness == pytest.approx(np.nanmean(tab["q_faithfulness"]))
    assert 0 < rep.faithfulness <= 1 and 0 < rep.relevancy <= 1
    np.testing.assert_allclose(tab["q_context_recall"], tab["recall@k"], atol=1e-9)
    # gold-only tables are keyed apart: the plain evaluator never sees q_ columns
    assert "q_faithfulness" not in ev.table(cfg, "valid")
