"""The tuner's latency comes from a per-stage cost model measured once and reused, and its rows
are lazy per (config, query) (issue 18): same seed, two runs -> identical rewards; a config's
latency does not depend on when it was evaluated; a rung of 25 queries computes 25 rows.
Real stack on the synthetic world (tantivy, FAISS, MiniLM, the extractive reader)."""

import json

import numpy as np
import pytest

from rag.config import RAGConfig
from rl.common.data import TuningData
from rl.kernel.cost_model import CostModel, Linear
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
from rl.tuner.ask_tell import run_search
from rl.tuner.plan import SearchPlan


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


def _rewards(result):
    return [(h["config_hash"], h["reward"]) for h in result.history]


def random_search(ev, budget, seed):
    """`budget` random configs of the full space, each on the whole valid split."""
    n = len(ev.data.examples("valid"))
    return run_search(ev, ConfigSpace(ev.policy), SearchPlan("random", budget * n, seed),
                      split="valid")


def test_same_seed_two_runs_give_identical_rewards(data, tmp_path):
    model = tmp_path / "cost-model.json"
    first = TunerEvaluator(data, cache_root=tmp_path / "run1", cost_model=model)
    # 3 configs of the full space (seed 3): two fail a gate, one passes
    a = random_search(first, budget=3, seed=3)
    saved = json.loads(model.read_text())
    assert saved["components"], "the first run measured and saved its cost model"
    # a second run: new process state, new row cache (every row recomputed, every stage
    # re-timed on whatever load there is now), the run's stored cost model
    second = TunerEvaluator(data, cache_root=tmp_path / "run2", cost_model=model)
    b = random_search(second, budget=3, seed=3)
    assert second.counters["queries_computed"] > 0
    assert _rewards(a) == _rewards(b)
    assert json.loads(model.read_text())["components"] == saved["components"]


def test_latency_is_the_same_first_or_after_another_config(data, tmp_path):
    model = tmp_path / "cost-model.json"
    x, y = RAGConfig(variant="dense", k=5), RAGConfig(variant="hybrid", k=3)
    ev1 = TunerEvaluator(data, cache_root=tmp_path / "a", cost_model=model)
    first = ev1.evaluate(x, "valid")
    again = ev1.evaluate(x, "valid")
    ev2 = TunerEvaluator(data, cache_root=tmp_path / "b", cost_model=model)
    ev2.evaluate(y, "valid")  # memoises every dense retrieval x needs
    after = ev2.evaluate(x, "valid")
    assert first.p95_latency_ms == again.p95_latency_ms == after.p95_latency_ms
    assert first.reward == again.reward == after.reward
    assert first.p95_latency_ms > 0


def test_rows_are_computed_lazily_per_query(data, tmp_path):
    ev = TunerEvaluator(data, cache_root=tmp_path, cost_model=tmp_path / "cm.json")
    cfg = RAGConfig(variant="bm25", k=4)
    n = len(data.examples("valid"))
    rung = np.arange(25)
    small = ev.evaluate(cfg, "valid", rung)
    assert small.n == 25 and not small.cached
    assert ev.counters["queries_computed"] == 25 and ev.cached_count(cfg, "valid") == 25
    tab = ev.table(cfg, "valid", rung)
    assert np.isnan(tab["f1"][25:]).all() and not np.isnan(tab["f1"][:25]).any()
    full = ev.evaluate(cfg, "valid")  # only the queries the rung did not answer
    assert ev.counters["queries_computed"] == n and full.n == n and not full.cached
    again = ev.evaluate(cfg, "valid", rung)
    assert again.cached and again.reward == small.reward
    # another process (a fresh evaluator on the same cache) reads the rows instead
    other = TunerEvaluator(data, cache_root=tmp_path, cost_model=tmp_path / "cm.json")
    assert other.evaluate(cfg, "valid").reward == full.reward
    assert other.counters["queries_computed"] == 0


def test_cost_model_prices_each_stage_from_its_components(tmp_path):
    measured: list[str] = []

    def measure(name):
        measured.append(name)
        return {"retrieve:bm25-tantivy": Linear(1.0), "retrieve:dense-flat": Linear(4.0),
                "fuse:rrf": Linear(0.5), "rerank:cosine:minilm": Linear(0.2, {"candidates": 0.1}),
                "mmr:dense-flat": Linear(0.3, {"pool": 0.01}),
                "generate:extractive:cpu": Linear(2.0, {"tokens_in": 0.01, "tokens_out": 0.1}),
                }[name]

    cm = CostModel(tmp_path / "cm.json", measure)
    rows = {"tokens_in": np.array([100.0, 200.0]), "tokens_out": np.array([10.0, 0.0]),
            "n_reranked": np.array([30.0, 30.0]), "mmr_pool": np.array([0.0, 20.0])}
    cfg = RAGConfig(variant="hybrid", normalisation="rrf", rerank="cosine", mmr_lambda=0.5)
    lat = cm.latency(cfg, rows)
    np.testing.assert_allclose(lat["retrieve_ms"], [5.5, 5.5])
    np.testing.assert_allclose(lat["rerank_ms"], [3.2, 3.2])
    np.testing.assert_allclose(lat["select_ms"], [0.0, 0.5])
    np.testing.assert_allclose(lat["generate_ms"], [4.0, 4.0])
    np.testing.assert_allclose(lat["latency_ms"], [12.7, 13.2])
    n_measured = len(measured)
    CostModel(tmp_path / "cm.json").latency(cfg, rows)  # saved: read back, nothing measured
    assert len(measured) == n_measured == 6
    with pytest.raises(KeyError, match="cannot measure"):
        CostModel(tmp_path / "cm.json").latency(cfg.replace(variant="bm25", rerank="none",
                                                            generator="other"), rows)


def test_linear_fit_recovers_slopes_and_never_goes_negative():
    xs = [{"tokens_in": float(t)} for t in (10, 20, 40, 80)]
    fit = Linear.fit(xs, [1.0 + 0.5 * x["tokens_in"] for x in xs])
    assert fit.intercept_ms == pytest.approx(1.0) and fit.slopes["tokens_in"] == pytest.approx(0.5)
    falling = Linear.fit(xs, [10.0 - 0.01 * x["tokens_in"] for x in xs])
    assert falling.slopes["tokens_in"] == 0.0
    assert Linear.fit([{}] * 3, [1.0, 9.0, 2.0]).intercept_ms == 2.0


def test_a_component_another_process_measured_is_read_not_measured_again(tmp_path):
    path = tmp_path / "cm.json"
    calls = []

    def measure(name):
        calls.append(name)
        return Linear(1.0 + len(calls))

    a, b = CostModel(path, measure), CostModel(path, measure)  # two processes, one file
    first = a.component("retrieve:bm25-tantivy")
    assert b.component("retrieve:bm25-tantivy") == first and calls == ["retrieve:bm25-tantivy"]


def test_the_retrieval_memo_lives_where_configured_and_is_shared(data, tmp_path, monkeypatch):
    from rl.kernel.evaluator import MEMO_DIR_ENV

    def memo_rows(ev):
        ev.memo.flush()
        return ev.memo.store._db.execute("SELECT COUNT(*) FROM memo").fetchone()[0]

    monkeypatch.delenv(MEMO_DIR_ENV, raising=False)
    assert TunerEvaluator(data, cache_root=tmp_path / "r0").memo.store.path.parent == \
        tmp_path / "r0"  # default: beside the rows
    own = TunerEvaluator(data, cache_root=tmp_path / "r1", memo_root=tmp_path / "own")
    assert own.memo.store.path.parent == tmp_path / "own"
    monkeypatch.setenv(MEMO_DIR_ENV, str(tmp_path / "shared"))
    model = tmp_path / "cost-model.json"  # one cost model: latency columns priced alike
    first = TunerEvaluator(data, cache_root=tmp_path / "r2", cost_model=model)
    assert first.memo.store.path.parent == tmp_path / "shared"
    cfg = RAGConfig(variant="hybrid", k=5)
    assert first.ensure_rows(cfg, "valid", range(10)) == 10
    filled = memo_rows(first)
    assert filled > 0
    # a second run with its own row cache over the same memo: its rows are computed, but no
    # question is retrieved again, and the rows are the first run's
    second = TunerEvaluator(data, cache_root=tmp_path / "r3", cost_model=model)
    assert second.ensure_rows(cfg, "valid", range(10)) == 10
    assert memo_rows(second) == filled
    a, b = first.table(cfg, "valid"), second.table(cfg, "valid")
    cols = sorted(c for c in a if not c.startswith("measured_"))  # wall times differ
    assert "tokens" in cols and set(cols) == {c for c in b if not c.startswith("measured_")}
    for col in cols:
        np.testing.assert_array_equal(a[col][:10], b[col][:10], err_msg=col)


def test_benchmarks_price_with_the_measured_cost_model_and_record_it(data, tmp_path,
                                                                    monkeypatch):
    """bench.common.evaluator prices latency with the library's cost model, kept beside the
    tuner's rows as `ragpilot tune` keeps it (no committed result is read), and
    `cost_model_used` records that model in full: its coefficients alone reproduce the run's
    latencies."""
    import bench.common as common

    import rl.kernel.evaluator as kernel_evaluator

    monkeypatch.setattr(kernel_evaluator, "cache_dir", lambda: tmp_path)
    ev, source = common.evaluator("synthetic", TunerSettings.defaults())
    assert source == {"source": "measured", "path": str(ev.cost_model.path)}
    assert ev.cost_model.path.parent == tmp_path / "tuner"
    config = RAGConfig(variant="bm25", k=3)
    tab = ev.table(config, "valid")
    used = common.cost_model_used(ev, source)
    assert set(used["components"]) == {*CostModel.retrieval_names(config),
                                       CostModel.generate_name(config)}
    assert used["meta"]["measured_at"] and used["path"] == source["path"]
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"meta": used["meta"], "components": used["components"]}))
    again = CostModel(replay)  # no measurer: a component missing from the record would raise
    np.testing.assert_allclose(again.latency(config, tab)["latency_ms"], tab["latency_ms"])
    assert float(np.mean(tab["latency_ms"])) > 0
