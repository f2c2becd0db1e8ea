"""`evaluate(config, slice)`: the one function the tuner env, the CLI and `POST /tuner/evaluate`
call. It returns faithfulness F, relevancy R, latency p50/p95 (ms), cost (tokens per query),
the reward and the gate verdicts for one RAGConfig on a slice (a split, or a batch of it).

How a step stays cheap (`TunerEvaluator`):
  1. retrieval is memoised per question (`rl.common.memo`, on disk): cold per-retriever costs are stored;
  2. the first evaluation of a config on a split answers every query with `Pipeline.run` (the
     stage code Serve runs) over the memoised indexes (`MemoIndexSet`, a
     `rag.index.provider.IndexProvider`), scores it and stores one row of metrics
     per query — a `QueryTable`, in memory and on disk (SQLite), keyed by corpus fingerprint,
     split ids, config hash and scorer version (`rows_version`: a fingerprint of the code
     that computes rows, so edited metric or stage code recomputes tables instead of reusing
     stale ones);
  3. every later evaluation (any batch of that split) is a numpy reduction over the table.
Latency in a table row (`MemoStageTimer`) = the stored cold cost of every retrieval/encoding the
query needed (a median measured once per question and retriever, stored in the memo) + the
measured time of the work that ran for real (fusion, rerank scoring, MMR, generation). Time
spent in memo lookups, in measuring a cold cost or in loading models and indexes is charged to
no stage, so a config's retrieval latency is the same whether it is evaluated first or after
others; only the warm stages' milliseconds are re-measured when a table is rebuilt.

Which per-query metrics play F and R is per dataset (`TunerSettings.datasets`): e.g. HotpotQA
F = `support` (answer grounded in its cited passages), R = answer `f1`; SciFact (no answers)
F = `recall@k` (context recall), R = `ndcg@10` of the reranked list. Naming a `q_` metric
(`q_faithfulness`, `q_answer_relevancy`, `q_context_precision`, `q_context_recall`) scores every
answer with `rag.metrics.quality.QualityScorer` (the local RAGAS-compatible metrics) as well; its
tables are keyed apart from gold-only ones. A dataset the policy does not name scores with the gold
it has (`DatasetSlice.for_gold`). Every row also records whether the answer abstained and whether
the gold marks the question unanswerable; `quality` scores abstentions by answerability
(`rl.tuner.reward.score_abstentions`) whatever F and R are.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import pickle
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.metrics import score_answer
from rag.metrics.claims import is_noncommittal
from rag.models import cache_dir
from rag.pipeline import STAGES, Pipeline, Resources, check_question
from rag.types import Answer, Example
from rl.common.data import TuningData
from rl.common.memo import MemoIndexSet
from rl.tuner.reward import PII_COLUMN, RewardSpec, StepMetrics, score_abstentions
from rl.tuner.settings import DatasetSlice, TunerSettings

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
QUALITY_VERSION = "quality-v1"
QUALITY_SOURCES = ("rag.metrics.quality",)


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


def gold_unanswerable(example: Example) -> bool:
    """The gold says the question cannot be answered from the corpus (MTRAG's answerability
    label UNANSWERABLE; datasets without labels: every question is answerable)."""
    label = (example.metadata or {}).get("answerability")
    return isinstance(label, str) and label.strip().lower() in UNANSWERABLE_LABELS


def _ids_fingerprint(examples: Sequence[Example]) -> str:
    return hashlib.sha256("\n".join(e.id for e in examples).encode()).hexdigest()[:12]


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TunerEvaluator:
    """Evaluates configs on one dataset's splits through cached per-query tables."""

    def __init__(self, data: TuningData, policy: TunerSettings | None = None,
                 cache_root: str | Path | None = None, resources: Resources | None = None):
        self.data = data
        self.policy = policy or TunerSettings.defaults()
        self.root = Path(cache_root) if cache_root else cache_dir() / "tuner"
        self.root.mkdir(parents=True, exist_ok=True)
        self.memo = MemoIndexSet(data.indexes, self.root)
        self.resources = resources or Resources()
        # a dataset the policy does not name scores with what gold it has
        default = DatasetSlice.for_gold(data.gold_kind())
        self.slice = self.policy.slice_for(data.name, default)
        self.thresholds = self.policy.thresholds_for(data.name, default)
        self._tables: dict[tuple[str, str], QueryTable] = {}
        self._lock = threading.RLock()
        fp = data.indexes.corpus.fingerprint()
        self._db = sqlite3.connect(str(self.root / f"rows-{fp}.sqlite"),
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, value BLOB)")
        self.counters = {"evaluations": 0, "tables_computed": 0, "queries_computed": 0}
        self.seen: dict[str, RAGConfig] = {}
        """Every config evaluated, by hash (reports value incumbents named by hash)."""
        self.uses_quality = any(m.startswith(QUALITY_PREFIX)
                                for m in (self.slice.faithfulness, self.slice.relevancy))
        self._quality = None

    @property
    def quality_scorer(self):
        """The local RAGAS-compatible scorer, loaded on first use (only when F or R names a
        `q_` metric)."""
        if self._quality is None:
            from rag.metrics.quality import QualityScorer

            self._quality = QualityScorer()
        return self._quality

    # ---- tables ---------------------------------------------------------------------------
    def _key(self, config: RAGConfig, split: str) -> str:
        ex = self.data.examples(split)
        return f"{rows_version(self.uses_quality)}:{self.data.name}:{split}:" \
               f"{_ids_fingerprint(ex)}:{config.config_hash}"

    def table(self, config: RAGConfig, split: str) -> QueryTable:
        """Per-query metrics of `config` on every query of `split` (computed once)."""
        key = self._key(config, split)
        with self._lock:
            mem = self._tables.get((split, key))
            if mem is not None:
                return mem
            row = self._db.execute("SELECT value FROM rows WHERE key=?", (key,)).fetchone()
            if row is not None:
                tab = pickle.loads(row[0])
            else:
                tab = self._compute(config, self.data.examples(split))
                self._db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?)",
                                 (key, pickle.dumps(tab)))
                self._db.commit()
                self.memo.flush()
            self._tables[(split, key)] = tab
            return tab

    def is_cached(self, config: RAGConfig, split: str) -> bool:
        key = self._key(config, split)
        if (split, key) in self._tables:
            return True
        return self._db.execute("SELECT 1 FROM rows WHERE key=?", (key,)).fetchone() is not None

    def _compute(self, config: RAGConfig, examples: Sequence[Example]) -> QueryTable:
        pipe = Pipeline(self.memo, config, self.resources)
        pipe.load_models()
        rows: list[dict[str, float]] = []
        answers: list[Answer] = []
        for e in examples:
            ans, trace = pipe.run_traced(e.question, e.id, self.memo.stage_timer())
            # a row's recall@n / ndcg@10 / mrr@10 read the reranked list: what rerank changes
            ans = replace(ans, candidates=tuple(trace.ranked))
            lat = ans.latency_ms
            row = score_answer(ans, e, k=config.k)
            # what `quality` scores abstentions by (rl.tuner.reward.score_abstentions)
            row[ABSTAINED] = float(is_noncommittal(ans.text))
            row[UNANSWERABLE] = float(gold_unanswerable(e))
            row.update({f"{s}_ms": lat[s] for s in STAGES})
            row["latency_ms"] = sum(lat[s] for s in STAGES)
            row["tokens"] = float(ans.tokens_in + ans.tokens_out)
            rows.append(row)
            answers.append(ans)
        if self.uses_quality:
            scored = self.quality_scorer.score_batch(answers, list(examples))
            for row, q in zip(rows, scored, strict=True):
                row.update({QUALITY_PREFIX + m: v for m, v in q.items()})
        self.counters["tables_computed"] += 1
        self.counters["queries_computed"] += len(examples)
        keys = sorted({k for r in rows for k in r})
        return {k: np.array([r.get(k, np.nan) for r in rows], dtype=np.float64) for k in keys}

    def recalibrate_latency(self, split: str, configs: Sequence[RAGConfig]) -> int:
        """Re-time the memoised retrieval costs of `split`'s questions on this (quiet) machine
        and shift the stored latency of every cached table of `configs` by the change, so
        tables built under load stop carrying its spikes. Fusion, rerank scoring and
        generation times stay as measured. Returns the number of tables updated."""
        from rl.common.memo import retime

        questions = [check_question(e.question) for e in self.data.examples(split)]
        changes = retime(self.memo, set(questions))
        delta = {}
        for (name, q), (old, new) in changes.items():
            delta.setdefault(name, {})[q] = new - old

        def d(name: str) -> np.ndarray:
            m = delta.get(name, {})
            return np.array([m.get(q, 0.0) for q in questions])

        n = 0
        for cfg in configs:
            key = self._key(cfg, split)
            row = self._db.execute("SELECT value FROM rows WHERE key=?", (key,)).fetchone()
            if row is None:
                continue
            tab = pickle.loads(row[0])
            b, dn = f"bm25-{cfg.bm25_backend}", f"dense-{cfg.dense_index}"
            shift = {"bm25": d(b), "dense": d(dn), "hybrid": d(b) + d(dn),
                     "graph": d(f"graph@{cfg.bm25_backend}+{cfg.dense_index}")}[cfg.variant]
            tab["retrieve_ms"] = tab["retrieve_ms"] + shift
            if cfg.rerank == "cosine" and cfg.reranker_model == self.data.indexes.encoder_name:
                tab["rerank_ms"] = tab["rerank_ms"] + d(f"{dn}-embed")
            if cfg.mmr_lambda < 1.0:  # MMR encodes the question (when it has more than k hits)
                tab["select_ms"] = tab["select_ms"] + d(f"{dn}-embed")
            tab["latency_ms"] = sum(tab[f"{s}_ms"] for s in STAGES)
            self._db.execute("UPDATE rows SET value=? WHERE key=?", (pickle.dumps(tab), key))
            self._tables.pop((split, key), None)
            n += 1
        self._db.commit()
        return n

    # ---- evaluation -----------------------------------------------------------------------
    def quality(self, tab: QueryTable) -> tuple[np.ndarray, np.ndarray]:
        """Per-query F and R arrays: the dataset's chosen metrics with abstentions scored by
        answerability (`rl.tuner.reward.score_abstentions`; one rule for batch and per-query
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
        cached = self.is_cached(config, split)
        tab = self.table(config, split)
        sel = None if idx is None else np.asarray(idx, dtype=np.int64)
        m = self.summarize(tab, sel)
        r, verdicts = self.reward_spec().reward(m)
        lat = tab["latency_ms"] if sel is None else tab["latency_ms"][sel]
        extra = {k: float(np.nanmean(v if sel is None else v[sel])) for k, v in tab.items()
                 if not np.all(np.isnan(v))}
        self.counters["evaluations"] += 1
        return EvalReport(self.data.name, split, config.model_dump(mode="json"),
                          config.config_hash, int(lat.size), m.faithfulness, m.relevancy,
                          float(np.percentile(lat, 50)), m.p95_latency_ms, m.cost, r,
                          verdicts.as_dict(), m.quality_se, extra,
                          (time.perf_counter() - t0) * 1000, cached)

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


def evaluate(config: RAGConfig | dict[str, Any], dataset: str = "synthetic",
             split: str | None = None, policy: TunerSettings | None = None,
             batch_size: int | None = None, seed: int = 0) -> EvalReport:
    """Evaluate one config on a dataset split (a random batch of it when `batch_size`)."""
    if isinstance(config, dict):
        config = RAGConfig.from_dict(config)
    ev = get_evaluator(dataset, policy)
    split = split or ev.slice.tune_split
    idx = None
    if batch_size is not None:
        n = len(ev.data.examples(split))
        if batch_size < 1:
            raise ConfigError("batch_size", "must be >= 1")
        idx = np.random.default_rng(seed).choice(n, size=min(batch_size, n), replace=False)
    return ev.evaluate(config, split, idx)
