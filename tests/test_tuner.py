"""The tuner's evaluation path on the synthetic world with the real stack (tantivy, FAISS,
MiniLM, graph, extractive reader): cached per-query tables, the env, the searches."""

from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rag.errors import ConfigError
from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.reward import StepMetrics, reward
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import exhaustive, run_search
from rl.tuner.env import TunerEnv
from rl.tuner.plan import SearchPlan


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


@pytest.fixture(scope="module")
def small_policy():
    # a small space keeps the module fast: 2 retrievers x 3 k x rerank x 1 prompt (+3 weights);
    # fusion_step = fusion_grid so every config an action can reach is in the grid; the heads
    # issue 18 added are pinned (with_legacy_space)
    return TunerSettings.defaults().with_overrides(
        k_grid=[3, 5, 8], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off", "on"],
                  "prompt_id": ["cite_concise"]},
        episode={"length": 4, "batch_size": 40}).with_legacy_space()


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


def test_grid_is_the_ceiling_and_searches_keep_budget(ev, small_policy):
    space = ConfigSpace(small_policy)
    grid = exhaustive(ev, space)
    rewards = [t.full["reward"] for t in grid.trials]
    assert len(grid.trials) == len(list(space.grid())) == space.size()
    assert ev.evaluate(grid.best_config).reward == pytest.approx(max(rewards))
    n = len(ev.data.examples(ev.slice.tune_split))
    for method in ("random", "tpe", "hyperopt", "local-asha"):
        res = run_search(ev, space, SearchPlan(method, budget=6 * n, seed=1))
        assert 6 * n <= res.query_evals < 7 * n, method
        # no static config on the full split beats the grid's best
        assert ev.evaluate(res.best_config).reward <= max(rewards) + 1e-9


def test_offline_evaluator_replays_real_tables(ev, small_policy):
    """The rollout's offline gate on the real stack: paired per-query rewards from the tuner's
    tables; a config compared with itself has Δ = 0 exactly, and the report's Δ is the mean of
    the per-query reward differences."""
    from rl.promotion.evaluators import OfflineEvaluator

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


# ---- holdout comparisons (rl.tuner.report) on hand-made tables: no dataset needed --------------------
class _TableEvaluator:
    """What rl.tuner.report reads of a TunerEvaluator: policy, thresholds, quality(table)."""

    def __init__(self, thresholds=None):
        from rl.kernel.settings import Thresholds

        self.policy = TunerSettings.defaults()
        self.thresholds = thresholds or Thresholds(faithfulness=0.75, relevancy=0.3,
                                                   p95_latency_ms=500)
        self.slice = self.policy.slice_for("synthetic")
        self.data = type("D", (), {"name": "synthetic"})()

    def quality(self, tab):
        return tab["support"], tab["f1"]


def _table(F, R, lat=100.0, tokens=300.0):
    F, R = np.asarray(F, dtype=float), np.asarray(R, dtype=float)
    return {"support": F, "f1": R, "latency_ms": np.full(F.size, lat),
            "tokens": np.full(F.size, tokens)}


def test_batch_rewards_equal_evaluate_with_missing_gold():
    """The report's vectorised reward is `evaluate`'s: F and R are NaN-aware means (a query
    without gold of a metric is left out, not scored 0), gates and penalties included."""
    from rl.tuner.report import batch_rewards

    stub = _TableEvaluator()
    rng = np.random.default_rng(0)
    R = rng.uniform(0.2, 0.9, 60)
    R[::4] = np.nan  # a quarter of the queries have no gold answer
    tab = _table(rng.uniform(0.6, 1.0, 60), R, lat=rng.uniform(50, 400, 60))
    m = TunerEvaluator.summarize(stub, tab)
    want, _ = reward(m, stub.policy.reward_weights, stub.thresholds,
                     stub.policy.cost_ref_tokens, stub.policy.instability_band)
    assert batch_rewards(stub, tab, np.arange(60)[None, :])[0] == pytest.approx(want)
    assert m.relevancy == pytest.approx(np.nanmean(R))


def test_compare_bootstraps_the_continuous_reward_and_reports_gates_apart():
    """A baseline whose F sits on its gate (0.76 vs 0.75): with the gate penalty inside the
    bootstrap, resamples where it fails add λ = 1 to Δ and the 'CI' spans ~[-0.2, +0.8]. The
    report's CI is the continuous part's (narrow, below 0) and the gate is reported apart, as a
    marginal pass with its own interval."""
    from rl.tuner.report import compare_tables

    stub = _TableEvaluator()
    n = 150
    rng = np.random.default_rng(1)
    f_base = np.r_[np.ones(114), np.zeros(36)]               # mean 0.76, on the 0.75 gate
    base = _table(f_base, np.full(n, 0.9))
    cand = _table(np.full(n, 0.95), 0.35 + rng.normal(0, 0.02, n))  # far from every gate
    c = compare_tables(stub, cand, base, "cand", "base", n_resamples=4000, seed=0)
    assert c.diff == pytest.approx(0.5 * (0.95 - 0.76) + 0.5 * (cand["f1"].mean() - 0.9))
    assert c.ci_low <= c.diff <= c.ci_high < 0
    assert c.ci_high - c.ci_low < 0.1
    # both pass every gate on the full split, so the full-reward Δ is the continuous Δ
    assert c.reward_diff == pytest.approx(c.diff)
    bf = {g.gate: g for g in c.baseline_gates}["faithfulness"]
    assert bf.passed and not bf.clear and bf.verdict == "pass (marginal)"
    assert bf.ci_low < 0.75 < bf.ci_high
    assert all(g.passed and g.clear for g in c.candidate_gates)
    assert c.gates_text(c.candidate_gates) == "pass"
    assert c.gates_text(c.baseline_gates).startswith("faithfulness 0.76")


def test_power_plan_from_per_query_faithfulness():
    from rl.stats.power import required_sample_size
    from rl.tuner.report import power_plan

    stub = _TableEvaluator()
    rng = np.random.default_rng(2)
    fb = rng.uniform(0.5, 1.0, 200)
    fa = np.clip(fb + rng.normal(0.02, 0.1, 200), 0, 1)
    plan = power_plan(stub, _table(fa, fb), _table(fb, fb), delta=0.03)
    assert plan.n == 200
    assert plan.n_paired == required_sample_size(0.03, float(np.std(fa - fb, ddof=1)))
    assert plan.n_per_arm == required_sample_size(0.03, float(np.std(fb, ddof=1)),
                                                  paired=False)
    assert "paired queries" in plan.describe()


# ---- the table cache key follows the scoring code ------------------------------------------------
def _copy_sources(tmp_path):
    import shutil

    src = Path(__file__).resolve().parents[1] / "src"
    for pkg in ("rag", "rl"):
        shutil.copytree(src / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return {"rag": tmp_path / "rag", "rl": tmp_path / "rl"}


def test_rows_code_fingerprint_changes_with_metric_code_not_with_docs(tmp_path):
    from rl.common.fingerprint import code_fingerprint, module_closure
    from rl.kernel.evaluator import ROWS_SOURCES, ROWS_STOP

    pk = _copy_sources(tmp_path)
    closure = module_closure(ROWS_SOURCES, ROWS_STOP, pk)
    assert {"rag.metrics.qa", "rag.metrics.citation", "rag.pipeline", "rag.fusion",
            "rag.generation.extractive", "rag.generation.prompts"} <= set(closure)
    assert not any(m.startswith("rag.index") for m in closure)  # retrieval: memoised apart
    before = code_fingerprint(ROWS_SOURCES, ROWS_STOP, packages=pk)
    qa = pk["rag"] / "metrics" / "qa.py"
    text = qa.read_text()
    # documentation only: same version
    qa.write_text(text.replace('"""(em, f1, precision, recall) against',
                               '"""(em, f1, precision, recall) — reworded — against')
                  + "\n# a comment\n")
    assert code_fingerprint(ROWS_SOURCES, ROWS_STOP, packages=pk) == before
    # a changed scorer: a new version
    qa.write_text(text.replace("em = max(exact_match(prediction, a) for a in answers)",
                               "em = min(exact_match(prediction, a) for a in answers)"))
    assert code_fingerprint(ROWS_SOURCES, ROWS_STOP, packages=pk) != before
    # a module the rows do not depend on: same version
    qa.write_text(text)
    (pk["rl"] / "stats" / "ope.py").write_text((pk["rl"] / "stats" / "ope.py").read_text() + "\nX = 1\n")
    assert code_fingerprint(ROWS_SOURCES, ROWS_STOP, packages=pk) == before


def test_retrieval_code_versions_the_memo_and_the_rows(tmp_path):
    from rl.common.fingerprint import code_fingerprint, module_closure
    from rl.common.memo import RETRIEVAL_SOURCES, RETRIEVAL_STOP

    pk = _copy_sources(tmp_path)
    closure = module_closure(RETRIEVAL_SOURCES, RETRIEVAL_STOP, pk)
    assert {"rag.index.bm25", "rag.index.dense", "rag.index.graph", "rag.encoders"} <= set(
        closure)
    assert "rag.config" not in closure and "rag.metrics.qa" not in closure
    before = code_fingerprint(RETRIEVAL_SOURCES, RETRIEVAL_STOP, packages=pk)
    graph = pk["rag"] / "index" / "graph.py"
    text = graph.read_text()
    graph.write_text(text + "\n# a comment\n")  # documentation only: same version
    assert code_fingerprint(RETRIEVAL_SOURCES, RETRIEVAL_STOP, packages=pk) == before
    graph.write_text(text + "\nDAMPING_FLOOR = 0.1\n")  # changed retriever code
    assert code_fingerprint(RETRIEVAL_SOURCES, RETRIEVAL_STOP, packages=pk) != before
    (pk["rag"] / "metrics" / "qa.py").write_text(
        (pk["rag"] / "metrics" / "qa.py").read_text() + "\nX = 1\n")  # scoring: not retrieval
    graph.write_text(text)
    assert code_fingerprint(RETRIEVAL_SOURCES, RETRIEVAL_STOP, packages=pk) == before


def test_the_memo_file_and_the_rows_key_carry_the_retrieval_version(ev):
    from rl.common.memo import retrieval_version
    from rl.kernel.evaluator import rows_version

    v = retrieval_version()
    assert ev.memo.store.path.name.endswith(f"-r{v}.sqlite")
    assert rows_version().endswith(f"+r{v}")


def test_changed_scorer_version_misses_the_table_cache(data, small_policy, ev, monkeypatch):
    import rl.kernel.evaluator as evaluation

    cfg = ConfigSpace(small_policy).base
    first = ev.evaluate(cfg)
    fresh = TunerEvaluator(data, small_policy, cache_root=ev.root)
    assert fresh.is_cached(cfg, "valid")
    monkeypatch.setattr(evaluation, "rows_version",
                        lambda quality=False: "rows-v1-0123456789ab")  # as if qa.py changed
    bumped = TunerEvaluator(data, small_policy, cache_root=ev.root)
    assert not bumped.is_cached(cfg, "valid")
    rep = bumped.evaluate(cfg)
    assert not rep.cached and bumped.counters["tables_computed"] == 1
    # same code underneath: the same quality (latency is re-measured, so the reward may move)
    assert (rep.faithfulness, rep.relevancy) == pytest.approx((first.faithfulness,
                                                               first.relevancy))


def test_warm_start_evaluates_the_default_first_and_never_ends_below_it(ev, small_policy):
    """`start`: a search's first trial is the given config, so the recommendation's full-split
    reward is at least the start's (a tuner that recommends a config that did worse than the
    one in production on its tuning split is a regression the user would not expect)."""
    base = small_policy.base_config()
    n = len(ev.data.examples(ev.slice.tune_split))
    for method, seed in (("tpe", 0), ("tpe", 1), ("local-asha", 2), ("random", 0)):
        res = run_search(ev, ConfigSpace(small_policy),
                         SearchPlan(method, budget=4 * n, seed=seed, start=base))
        assert res.trials[0].config.config_hash == base.config_hash
        assert res.best_reward >= res.trials[0].full["reward"]
