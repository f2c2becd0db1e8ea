"""`evaluate(config, slice)`: the one function the tuner env, the CLI and `POST /tuner/evaluate`
call. It returns faithfulness F, relevancy R, latency p50/p95 (ms), cost (tokens per query),
the reward and the gate verdicts for one RAGConfig on a slice (a split, or a batch of it).

How a step stays cheap (`TunerEvaluator`):
  1. retrieval is memoised per question (`rl.common.memo`, on disk: beside the rows, or in
     `$RAGPILOT_MEMO_DIR` when set, so runs with their own row caches share one memo);
  2. rows are per (config, query) and lazy: an evaluation on queries `idx` of a split answers
     only those of them no earlier evaluation answered, with `Pipeline.run_traced` (the stage
     code Serve runs) over the memoised indexes (`MemoIndexSet`, a
     `rag.index.provider.IndexProvider`), scores them and stores one row per query, in memory
     and on disk (SQLite `qrows`, keyed by scorer version, dataset, config hash and query id;
     `rows_version` is a fingerprint of the code that computes rows, so edited metric or stage
     code recomputes rows instead of reusing stale ones). Fidelity rungs (25 -> 75 -> the full
     split, `rl.tuner.fidelity`) therefore cost what they evaluate, and a config promoted to
     the next rung pays only for the new queries;
  3. every evaluation is then a numpy reduction over the split's rows.
Latency is priced by the per-stage cost model (`rl.kernel.cost_model`), measured once per
component from repeated medians and saved beside the rows: the same rows give the same reward in
every run, whatever the load while they were built. Rows keep the wall time each stage took
(`measured_<stage>_ms`) for inspection only.

Which per-query metrics play F and R is per dataset (`TunerSettings.datasets`): e.g. HotpotQA
F = `support` (answer grounded in its cited passages), R = answer `f1`; SciFact (no answers)
F = `recall@k` (context recall), R = `ndcg@10` of the reranked list. Naming a `q_` metric
(`q_faithfulness`, `q_answer_relevancy`, `q_context_precision`, `q_context_recall`) scores every
answer with `rag.metrics.quality.QualityScorer` (the local RAGAS-compatible metrics) as well; its
tables are keyed apart from gold-only ones; naming a `sig_` metric (`sig_relevancy`,
`sig_faithfulness`, `sig_combined`) adds the reference-free answer signals of
`rag.metrics.signals`. A dataset the policy does not name scores with the gold
it has (`DatasetSlice.for_gold`). Every row also records whether the answer abstained and whether
the gold marks the question unanswerable; `quality` scores abstentions by answerability
(`rl.kernel.reward.score_abstentions`) whatever F and R are.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rag import progress
from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.metrics import score_answer
from rag.metrics.claims import is_noncommittal
from rag.models import cache_dir
from rag.pipeline import STAGES, Pipeline, Resources
from rag.types import Answer, Example
from rl.common.data import TuningData
from rl.common.memo import MemoIndexSet
from rl.kernel.cost_measure import make_measurer
from rl.kernel.cost_model import CostModel
from rl.kernel.reward import PII_COLUMN, RewardSpec, StepMetrics, score_abstentions
from rl.kernel.settings import DatasetSlice, TunerSettings

ROWS_VERSION = "rows-v1"
"""Manual part of the table key: bump it when rows change for a reason the code fingerprint
cannot see (new model weights behind the same generator name, a changed data file)."""
ROWS_SOURCES = ("rag.metrics", "rag.pipeline", "rag.fusion", "rag.rerank", "rag.generation",
                "rl.common.memo")
"""Modules whose code computes a table row (scoring, fusion, rerank, selection, generation,
the memoised candidates); with everything of the project they import they make the automatic
part of the table key (`rows_version`)."""
ROWS_STOP = ("rag.index", "rag.indexset", "rag.corpus", "rag.encoders")
"""Not followed here: retrieval and its encoders reach the rows only through `rl.common.memo`, whose
store is keyed by corpus, encoder, retriever and the retrieval code (`retrieval_version`, also
part of `rows_version`)."""
QUERY_EVALUATIONS = "query-evaluations"
"""The unit of a tuning budget (one config scored on one query): `ensure_rows` adds each one
`_compute` computes to the open `rag.progress` stage counted in it (`tune: search`)."""
QUALITY_PREFIX = "q_"
"""Per-query metrics from the QualityScorer are stored as `q_<ragas metric name>`."""
ABSTAINED = "abstained"
"""Row column: 1 when the answer abstains (`rag.metrics.claims.is_noncommittal`), else 0."""
UNANSWERABLE = "unanswerable"
"""Row column: 1 when the gold marks the question unanswerable (`gold_unanswerable`), else 0."""
UNANSWERABLE_LABELS = frozenset({"unanswerable"})
"""Answerability labels (`Example.metadata["answerability"]`, lower-cased) that mark a question
unanswerable. MTRAG's PARTIAL and UNDERSPECIFIED are not: their gold is a partial answer or a
clarifying question, which an abstention does not give."""
MEMO_DIR_ENV = "RAGPILOT_MEMO_DIR"
"""Where the retrieval memo lives when set (default: the evaluator's cache root, beside its
rows). The memo depends only on the corpus, the encoder, the retrievers and their code (its
file name carries all four), never on a run's configs or rewards, so any number of row caches
can share one: a cluster's shared volume, or a test session's runs on fresh row caches."""
QUALITY_VERSION = "quality-v1"
QUALITY_SOURCES = ("rag.metrics.quality", "rag.metrics.signals")
SIGNAL_PREFIX = "sig_"
"""Per-query reference-free answer signals (`rag.metrics.signals`: sig_relevancy,
sig_faithfulness, sig_combined), computed when F or R names one."""


@functools.cache
def rows_version(quality: bool = False) -> str:
    """The scorer version in a table's key: `ROWS_VERSION` + a fingerprint of the code of
    `ROWS_SOURCES` (transitively; docstrings and comments do not count) and of
    `TunerEvaluator._compute` (and `gold_unanswerable`); with `quality`, also `QUALITY_VERSION` + the fingerprint of the
    QualityScorer's code; and the retrieval code's version (`rl.common.memo.retrieval_version`: the
    candidates a row was computed from). A change to any of it makes every table miss the
    cache once."""
    from rl.common.fingerprint import code_fingerprint
    from rl.common.memo import retrieval_version

    compute = [inspect.getsource(TunerEvaluator._compute), inspect.getsource(gold_unanswerable),
               repr(sorted(UNANSWERABLE_LABELS))]
    v = f"{ROWS_VERSION}-{code_fingerprint(ROWS_SOURCES, ROWS_STOP, compute)}" \
        f"+r{retrieval_version()}"
    if quality:
        v += f":{QUALITY_VERSION}-{code_fingerprint(QUALITY_SOURCES, ROWS_STOP)}"
    return v


def _count_query_evaluation() -> None:
    """One query-evaluation done: counted into the open `rag.progress` stage of
    `QUERY_EVALUATIONS` (e.g. `tune: search`, mid-trial); a no-op when none is open."""
    progress.advance(1, QUERY_EVALUATIONS)


def gold_unanswerable(example: Example) -> bool:
    """The gold says the question cannot be answered from the corpus (MTRAG's answerability
    label UNANSWERABLE; datasets without labels: every question is answerable)."""
    label = (example.metadata or {}).get("answerability")
    return isinstance(label, str) and label.strip().lower() in UNANSWERABLE_LABELS


# ---- per-query tables -------------------------------------------------------------------------
QueryTable = dict[str, np.ndarray]
"""metric name -> one float per query of the split (NaN where a query has no such gold)."""


@dataclass
class EvalReport:
    """What `evaluate` returns; `to_dict()` is the JSON the API answers with."""

    dataset: str
    split: str
    config: dict[str, Any]
    config_hash: str
    n: int
    faithfulness: float
    relevancy: float
    p50_latency_ms: float
    p95_latency_ms: float
    cost: float
    reward: float
    gates: dict[str, bool]
    quality_se: float
    metrics: dict[str, float] = field(default_factory=dict)
    elapsed_ms: float = 0.0
    cached: bool = True
    shaped_reward: float = float("nan")
    """`RewardSpec.shaped_reward` of the same batch: PPO's training signal when
    `TunerSettings.gate_penalty` is "shaped"."""
    violations: dict[str, float] = field(default_factory=dict)
    """Each hard gate's relative violation (`rl.kernel.reward.Gate.violation`; <= 0 passes):
    the feasibility signal constrained searchers read."""
    warnings: list[str] = field(default_factory=list)
    """Gold of the split the corpus cannot reach (`TuningData.gold_report`), set by `evaluate`,
    the one-call entry point (`ragpilot tuner-eval`, `POST /tuner/evaluate`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TunerEvaluator:
    """Evaluates configs on one dataset's splits through cached per-query tables."""

    def __init__(self, data: TuningData, policy: TunerSettings | None = None,
                 cache_root: str | Path | None = None, resources: Resources | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 memo_root: str | Path | None = None):
        self.data = data
        self.policy = policy or TunerSettings.defaults()
        self.root = Path(cache_root) if cache_root else cache_dir() / "tuner"
        self.root.mkdir(parents=True, exist_ok=True)
        # the retrieval memo: `memo_root`, else $RAGPILOT_MEMO_DIR, else beside the rows
        memo = memo_root or os.environ.get(MEMO_DIR_ENV) or self.root
        self.memo = MemoIndexSet(data.indexes, Path(memo))
        self.resources = resources or Resources()
        # a dataset the policy does not name scores with what gold it has
        default = DatasetSlice.for_gold(data.gold_kind())
        self.slice = self.policy.slice_for(data.name, default)
        self.thresholds = self.policy.thresholds_for(data.name, default)
        self._rows: dict[str, dict[str, dict[str, float]]] = {}
        """config key -> query id -> row (what the on-disk `qrows` table holds, read once)."""
        self._assembled: dict[tuple[str, str], QueryTable] = {}
        self._lock = threading.RLock()
        fp = data.indexes.corpus.fingerprint()
        self._db = sqlite3.connect(str(self.root / f"qrows-{fp}.sqlite"),
                                   check_same_thread=False, timeout=60.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS qrows (cfg TEXT, qid TEXT, value TEXT, "
                         "PRIMARY KEY (cfg, qid))")
        if not isinstance(cost_model, CostModel):
            path = Path(cost_model) if cost_model else self.root / f"cost-model-{fp}.json"
            cost_model = CostModel(path, make_measurer(
                data.indexes, self.resources, lambda: data.examples(self.slice.tune_split),
                self.policy.base_config()))
        self.cost_model = cost_model
        """Prices every row's latency (`rl.kernel.cost_model`): measured once per component,
        saved beside the rows and reused, so rewards do not depend on the load while rows are
        built."""
        self.counters = {"evaluations": 0, "tables_computed": 0, "queries_computed": 0}
        self.seen: dict[str, RAGConfig] = {}
        """Every config evaluated, by hash (reports value incumbents named by hash)."""
        self.uses_quality = any(m.startswith(QUALITY_PREFIX)
                                for m in (self.slice.faithfulness, self.slice.relevancy))
        self.uses_signals = any(m.startswith(SIGNAL_PREFIX)
                                for m in (self.slice.faithfulness, self.slice.relevancy))
        self._quality = None
        self._signals = None

    @property
    def signals(self):
        """The reference-free answer signals (rag.metrics.signals.AnswerSignals), loaded on
        first use (only when F or R names a `sig_` metric)."""
        if self._signals is None:
            from rag.metrics.signals import AnswerSignals

            self._signals = AnswerSignals()
        return self._signals

    @property
    def quality_scorer(self):
        """The local RAGAS-compatible scorer, loaded on first use (only when F or R names a
        `q_` metric)."""
        if self._quality is None:
            from rag.metrics.quality import QualityScorer

            self._quality = QualityScorer()
        return self._quality

    # ---- rows -------------------------------------------------------------------------------
    def _cfg_key(self, config: RAGConfig) -> str:
        return (f"{rows_version(self.uses_quality or self.uses_signals)}"
                f"{':sig' if self.uses_signals else ''}:{self.data.name}:{config.config_hash}")

    def _load_rows(self, key: str) -> dict[str, dict[str, float]]:
        """Every stored row of one config (query id -> row), read once per process."""
        rows = self._rows.get(key)
        if rows is None:
            got = self._db.execute("SELECT qid, value FROM qrows WHERE cfg=?", (key,)).fetchall()
            rows = {qid: json.loads(v) for qid, v in got}
            self._rows[key] = rows
        return rows

    def ensure_rows(self, config: RAGConfig, split: str,
                    idx: np.ndarray | Sequence[int] | None = None) -> int:
        """Compute (and store) the rows of `config` for queries `idx` of `split` (all when None)
        that no earlier evaluation computed. Returns how many were computed now."""
        ex = self.data.examples(split)
        want = range(len(ex)) if idx is None else np.asarray(idx, dtype=np.int64)
        with self._lock:
            key = self._cfg_key(config)
            rows = self._load_rows(key)
            todo = [ex[int(i)] for i in want if ex[int(i)].id not in rows]
            if todo:
                new = self._compute(config, todo, on_query=_count_query_evaluation)
                for e, row in zip(todo, new, strict=True):
                    rows[e.id] = row
                self._db.executemany("INSERT OR REPLACE INTO qrows VALUES (?, ?, ?)",
                                     [(key, e.id, json.dumps(r)) for e, r in
                                      zip(todo, new, strict=True)])
                self._db.commit()
                self.memo.flush()
                self._assembled.pop((key, split), None)
            return len(todo)

    def table(self, config: RAGConfig, split: str,
              idx: np.ndarray | Sequence[int] | None = None) -> QueryTable:
        """Per-query metrics of `config` on `split`: one value per query of the split, NaN in
        every column of a query not computed yet. Rows `idx` (all when None) are computed first
        when missing; latency columns come from the cost model (`rl.kernel.cost_model`)."""
        self.ensure_rows(config, split, idx)
        return self._assemble(config, split)

    def _assemble(self, config: RAGConfig, split: str) -> QueryTable:
        """The split's rows of `config` as columns (NaN where a query has no row yet), with
        the cost model's latency columns; cached until new rows arrive."""
        key = self._cfg_key(config)
        with self._lock:
            tab = self._assembled.get((key, split))
            if tab is None:
                rows = self._load_rows(key)
                ex = self.data.examples(split)
                got = [rows.get(e.id) for e in ex]
                cols = sorted({c for r in got if r for c in r})
                tab = {c: np.array([np.nan if r is None else r.get(c, np.nan) for r in got],
                                   dtype=np.float64) for c in cols}
                tab.update(self.cost_model.latency(config, tab))
                self._assembled[(key, split)] = tab
            return tab

    def is_cached(self, config: RAGConfig, split: str) -> bool:
        """Every query of `split` has a stored row for `config`."""
        return self.cached_count(config, split) == len(self.data.examples(split))

    def cached_count(self, config: RAGConfig, split: str) -> int:
        with self._lock:
            rows = self._load_rows(self._cfg_key(config))
            return sum(e.id in rows for e in self.data.examples(split))

    def _compute(self, config: RAGConfig, examples: Sequence[Example],
                 on_query: Callable[[], object] | None = None) -> list[dict[str, float]]:
        """One row per example of `examples` (in their order), scored with `config`;
        `on_query()` is called after each example's answer is scored. This source is part of
        `rows_version`: what a caller does per query (progress) stays in `on_query`."""
        pipe = Pipeline(self.memo, config, self.resources)
        pipe.load_models()
        rows: list[dict[str, float]] = []
        answers: list[Answer] = []
        for e in examples:
            ans, trace = pipe.run_traced(e.question, e.id, self.memo.stage_timer(), e.history)
            # a row's recall@n / ndcg@10 / mrr@10 read the reranked list: what rerank changes
            ans = replace(ans, candidates=tuple(trace.ranked))
            row = score_answer(ans, e, k=config.k)
            # what `quality` scores abstentions by (rl.kernel.reward.score_abstentions)
            row[ABSTAINED] = float(is_noncommittal(ans.text))
            row[UNANSWERABLE] = float(gold_unanswerable(e))
            # what the cost model prices (rl.kernel.cost_model); the wall times are kept only
            # for inspection: no reward reads them
            row["tokens_in"], row["tokens_out"] = float(ans.tokens_in), float(ans.tokens_out)
            row["tokens"] = row["tokens_in"] + row["tokens_out"]
            row["n_reranked"] = float(0 if config.rerank == "none"
                                      else min(config.rerank_depth, len(trace.candidates)))
            mmr = config.mmr_lambda < 1.0 and len(trace.ranked) > config.k
            row["mmr_pool"] = float(min(len(trace.ranked), 4 * config.k) if mmr else 0)
            row.update({f"measured_{s}_ms": ans.latency_ms[s] for s in STAGES})
            rows.append({k: float(v) for k, v in row.items()})
            answers.append(ans)
            if on_query is not None:
                on_query()
        if self.uses_quality:
            scored = self.quality_scorer.score_batch(answers, list(examples))
            for row, q in zip(rows, scored, strict=True):
                row.update({QUALITY_PREFIX + m: float(v) for m, v in q.items()})
        if self.uses_signals:
            for row, sg in zip(rows, self.signals.score_batch(answers), strict=True):
                row.update({m: float(v) for m, v in sg.items()})
        self.counters["tables_computed"] += 1
        self.counters["queries_computed"] += len(examples)
        return rows

    # ---- evaluation -----------------------------------------------------------------------
    def quality(self, tab: QueryTable) -> tuple[np.ndarray, np.ndarray]:
        """Per-query F and R arrays: the dataset's chosen metrics with abstentions scored by
        answerability (`rl.kernel.reward.score_abstentions`; one rule for batch and per-query
        rewards, the report and the promotion evaluators, which all read F and R here)."""
        for name in (self.slice.faithfulness, self.slice.relevancy):
            if name not in tab:
                raise ConfigError(f"policy.datasets.{self.data.name}",
                                  f"metric {name!r} is not measured on this dataset (have: "
                                  f"{', '.join(sorted(tab))})")
        F, R = tab[self.slice.faithfulness], tab[self.slice.relevancy]
        if ABSTAINED in tab:  # tables of stand-ins (tests, replays) may not record it
            n = F.shape[-1]
            F, R = score_abstentions(F, R, tab[ABSTAINED],
                                     tab.get(UNANSWERABLE, np.zeros(n)))
            F, R = np.asarray(F, dtype=np.float64), np.asarray(R, dtype=np.float64)
        return F, R

    def reward_spec(self) -> RewardSpec:
        """The reward this evaluator scores with: the policy's weights, C_ref and band with
        this dataset's thresholds."""
        return RewardSpec.from_settings(self.policy, self.thresholds)

    def summarize(self, tab: QueryTable, idx: np.ndarray | None = None) -> StepMetrics:
        """Batch metrics of rows `idx` of `tab` (all rows when None): `RewardSpec.batch`."""
        F, R = self.quality(tab)
        cols = [F, R, tab["latency_ms"], tab["tokens"], tab.get(PII_COLUMN)]
        if idx is not None:
            cols = [None if c is None else c[idx] for c in cols]
        # through the class: the report's table-only stand-ins have no `reward_spec` of their own
        return TunerEvaluator.reward_spec(self).batch(*cols)

    def evaluate(self, config: RAGConfig, split: str | None = None,
                 idx: np.ndarray | Sequence[int] | None = None) -> EvalReport:
        """F, R, latency, cost, reward and gates of `config` on `split` (or rows `idx` of it)."""
        t0 = time.perf_counter()
        split = split or self.slice.tune_split
        self.seen[config.config_hash] = config
        sel = None if idx is None else np.asarray(idx, dtype=np.int64)
        cached = self.ensure_rows(config, split, sel) == 0
        tab = self._assemble(config, split)  # only rows `sel` were computed (lazy fidelity)
        m = self.summarize(tab, sel)
        spec = self.reward_spec()
        r, verdicts = spec.reward(m)
        viol = {g: float(v) for g, v in spec.violations(m).items()}
        lat = tab["latency_ms"] if sel is None else tab["latency_ms"][sel]
        picked = {k: (v if sel is None else v[sel]) for k, v in tab.items()}
        extra = {k: float(np.nanmean(v)) for k, v in picked.items() if not np.all(np.isnan(v))}
        self.counters["evaluations"] += 1
        return EvalReport(self.data.name, split, config.model_dump(mode="json"),
                          config.config_hash, int(lat.size), m.faithfulness, m.relevancy,
                          float(np.percentile(lat, 50)), m.p95_latency_ms, m.cost, r,
                          verdicts.as_dict(), m.quality_se, extra,
                          (time.perf_counter() - t0) * 1000, cached,
                          float(spec.shaped_reward(m)), viol)

    def per_query_quality(self, tab: QueryTable) -> np.ndarray:
        """Quality of each query alone, αF + βR (`RewardSpec.quality` of `quality`'s F and R):
        the quality side of `per_query_reward`, which per-query tables report apart."""
        F, R = self.quality(tab)
        return np.asarray(self.reward_spec().quality(F, R), dtype=np.float64)

    def per_query_reward(self, tab: QueryTable) -> np.ndarray:
        """Reward of each query alone (`RewardSpec.per_query`: latency and cost per query, no
        batch gates): what a per-query policy is trained on and what paired bootstraps
        resample."""
        F, R = self.quality(tab)
        return self.reward_spec().per_query(F, R, tab["latency_ms"], tab["tokens"],
                                            tab.get(PII_COLUMN))


# ---- the one entry point ---------------------------------------------------------------------
_EVALUATORS: dict[tuple[str, str], TunerEvaluator] = {}
_EV_LOCK = threading.Lock()


def get_evaluator(dataset: str, policy: TunerSettings | None = None,
                  cache_root: str | Path | None = None) -> TunerEvaluator:
    """A process-wide evaluator per (dataset, policy, cache_root): tables and models are
    loaded once. `cache_root`: its table/memo directory (None: `<cache>/tuner`)."""
    policy = policy or TunerSettings.defaults()
    key = (dataset, hashlib.sha256(json.dumps(policy.model_dump(mode="json"),
                                              sort_keys=True).encode()).hexdigest(),
           None if cache_root is None else str(cache_root))
    with _EV_LOCK:
        if key not in _EVALUATORS:
            _EVALUATORS[key] = TunerEvaluator(TuningData.open(dataset), policy, cache_root)
        return _EVALUATORS[key]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def evaluate(config: RAGConfig | dict[str, Any], dataset: str = "synthetic",
             split: str | None = None, settings: TunerSettings | None = None,
             batch_size: int | None = None, seed: int = 0,
             allow_missing_gold: bool = False) -> EvalReport:
    """Evaluate one config on a dataset split (a random batch of it when `batch_size`) under the
    tuner `settings` (default `TunerSettings.defaults()`: configs/rl/tuner.yaml). The
    split's gold is checked against the corpus first (`TuningData.check_gold`): more than half
    of its questions unreachable is a DataError unless `allow_missing_gold`; fewer are counted
    in the report's `warnings`. An argument of the wrong type, an empty split name, or a
    `batch_size` above the split's size is a ConfigError naming it (a larger batch is not
    quietly cut to the split)."""
    if isinstance(config, dict):
        config = RAGConfig.from_dict(config)
    for name, value, ok, what in (
            ("config", config, isinstance(config, RAGConfig), "a RAGConfig or a mapping"),
            ("dataset", dataset, isinstance(dataset, (str, os.PathLike)) and str(dataset),
             "a dataset name or path"),
            ("split", split, split is None or (isinstance(split, str) and split),
             "a split name (None: the tuning split)"),
            ("settings", settings, settings is None or isinstance(settings, TunerSettings),
             "TunerSettings or None"),
            ("batch_size", batch_size, batch_size is None or _is_int(batch_size),
             "an int or None"),
            ("seed", seed, _is_int(seed) and seed >= 0, "an int >= 0")):
        if not ok:
            raise ConfigError(name, f"expected {what}, got {value!r}")
    ev = get_evaluator(str(dataset), settings)
    split = split or ev.slice.tune_split
    ev.data.check_gold([split], allow_missing_gold,
                       override="set allow_missing_gold (the CLI: --allow-missing-gold)")
    idx = None
    if batch_size is not None:
        n = len(ev.data.examples(split))
        if not 1 <= batch_size <= n:
            raise ConfigError("batch_size", f"must be 1..{n} (split {split} has {n} "
                                            f"questions; None evaluates all of them)")
        idx = np.random.default_rng(seed).choice(n, size=batch_size, replace=False)
    report = ev.evaluate(config, split, idx)
    report.warnings = ev.data.gold_warnings(split)
    return report
