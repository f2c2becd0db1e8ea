"""The tuner's latency: a per-stage cost model, measured once and reused.

A config's latency on a query is predicted, not timed while the table is built:

    retrieve = retriever[variant]                        (+ fusion[normalisation] for hybrid)
    rerank   = a + b · candidates reranked               (per reranker; 0 when rerank is off)
    select   = a + b · MMR pool size                     (0 when MMR does not run)
    generate = a + b · tokens in + c · tokens out        (per generator)

Each line is a `Linear` component fitted from repeated medians (`REPEATS` timings of each of
`QUERIES` fixed queries, median per query, then a least-squares fit over the sizes measured, or
the median over queries for a constant). Components are measured on first use, on the process
that builds the model, and saved as JSON (`CostModel.path`); every later evaluation and every
later run on the same cache reads the saved numbers. So two runs with the same seed score
identical rewards however loaded the machine is while they run, and the first config evaluated
is charged exactly what it is charged when evaluated last (nothing measured while rows are built
reaches the reward, so a cold retrieval is never counted twice).

What the table rows keep is what the model needs per query (tokens in/out, candidates
reranked, MMR pool) and, for inspection, the wall time each stage took when the row was built
(`measured_<stage>_ms`). Re-measure by deleting the file (`CostModel.remeasure`).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig

QUERIES = 12
"""Fixed queries (the first of the tune split) each component is timed on."""
REPEATS = 5
"""Timings per (query, size); their median is the query's cost: one timing taken while another
process holds the core can be 10x the steady-state cost."""
STAGE_COLUMNS = ("retrieve_ms", "rerank_ms", "select_ms", "generate_ms")


@dataclass(frozen=True)
class Linear:
    """ms = intercept + Σ slope[feature] · feature. `n` timings went into the fit."""

    intercept_ms: float
    slopes: dict[str, float] = field(default_factory=dict)
    n: int = 0

    def predict(self, **features: np.ndarray | float) -> np.ndarray | float:
        out = self.intercept_ms
        for name, slope in self.slopes.items():
            out = out + slope * np.asarray(features[name], dtype=np.float64)
        return out

    @classmethod
    def fit(cls, xs: Sequence[Mapping[str, float]], ms: Sequence[float]) -> Linear:
        """Least squares over the measured points (slopes clipped at 0: a cost never falls
        with size; a constant when no features vary)."""
        names = sorted({k for x in xs for k in x})
        y = np.asarray(ms, dtype=np.float64)
        if not names:
            return cls(float(np.median(y)), {}, len(y))
        X = np.column_stack([np.ones(len(y))] + [[x.get(n, 0.0) for x in xs] for n in names])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        slopes = {n: float(max(c, 0.0)) for n, c in zip(names, coef[1:], strict=True)}
        resid = y - sum(slopes[n] * X[:, i + 1] for i, n in enumerate(names))
        return cls(float(max(np.median(resid), 0.0)), slopes, len(y))


def median_ms(call: Callable[[], Any], repeats: int = REPEATS) -> float:
    """Median wall time of `repeats` calls, in ms."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times))


def machine_tag() -> str:
    """Where a model was measured (it does not transfer between machines)."""
    return f"{platform.node()}|{platform.machine()}|{os.cpu_count()}cpu"


class CostModel:
    """Named `Linear` components, measured on first use by `measure(name)` and saved to `path`.

    `measure(name) -> Linear` is supplied by the evaluator (it owns the indexes, models and the
    fixed queries); `latency(config, rows)` predicts the per-stage latency of rows of one config.
    Thread-safe. A process reads the file again before measuring a component it lacks, so
    processes that share `path` (Tune trials, env runners, the driver) price with the numbers
    the first of them measured; two that measure the same missing component at the same moment
    keep their own numbers and the last writer's win for later runs."""

    def __init__(self, path: str | Path, measure: Callable[[str], Linear] | None = None):
        self.path = Path(path)
        self._measure = measure
        self._lock = threading.RLock()
        self.components: dict[str, Linear] = {}
        self.meta: dict[str, Any] = {"machine": machine_tag(), "queries": QUERIES,
                                     "repeats": REPEATS}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            self.meta = saved.get("meta", self.meta)
            self.components = {k: Linear(**v) for k, v in saved["components"].items()}

    # ---- components ---------------------------------------------------------------------------
    def component(self, name: str) -> Linear:
        with self._lock:
            if name not in self.components and self.path.exists():
                # another process (a Tune trial, a remote env runner) may have measured it:
                # every process must price with the same numbers
                saved = json.loads(self.path.read_text())["components"]
                for k, v in saved.items():
                    self.components.setdefault(k, Linear(**v))
            if name not in self.components:
                if self._measure is None:
                    raise KeyError(f"cost model {self.path} has no component {name!r} and "
                                   f"cannot measure one")
                self.components[name] = self._measure(name)
                self.meta["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                self.save()
            return self.components[name]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def to_dict(self) -> dict[str, Any]:
        """What a run stores in its metadata: every component's coefficients."""
        return {"meta": dict(self.meta),
                "components": {k: asdict(v) for k, v in sorted(self.components.items())}}

    def remeasure(self) -> None:
        """Forget every component (and the file): the next use measures again."""
        with self._lock:
            self.components.clear()
            self.path.unlink(missing_ok=True)

    # ---- prediction ---------------------------------------------------------------------------
    @staticmethod
    def retrieval_names(config: RAGConfig) -> list[str]:
        """The components a config's retrieve stage is made of."""
        c = config
        bm25, dense = f"retrieve:bm25-{c.bm25_backend}", f"retrieve:dense-{c.dense_index}"
        if c.variant == "bm25":
            return [bm25]
        if c.variant == "dense":
            return [dense]
        if c.variant == "graph":
            return [f"retrieve:graph@{c.bm25_backend}+{c.dense_index}:"
                    f"{c.graph_damping}:{c.graph_seeds}"]
        return [bm25, dense, f"fuse:{c.normalisation}"]

    @staticmethod
    def rerank_name(config: RAGConfig) -> str | None:
        if config.rerank == "none":
            return None
        return f"rerank:{config.rerank}:{config.reranker_model}"

    @staticmethod
    def generate_name(config: RAGConfig) -> str:
        return f"generate:{config.generator}:{config.device}"

    def latency(self, config: RAGConfig, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-stage latency (ms, one value per row) of `config` on `rows` (columns
        `tokens_in`, `tokens_out`, `n_reranked`, `mmr_pool`), and their sum `latency_ms`."""
        rows = {c: np.asarray(rows[c], dtype=np.float64)
                for c in ("tokens_in", "tokens_out", "n_reranked", "mmr_pool")}
        zeros = np.zeros(len(rows["tokens_in"]))
        retrieve = zeros + sum(float(self.component(c).predict()) for c in
                               self.retrieval_names(config))
        rr, reranked = self.rerank_name(config), rows["n_reranked"]
        rerank = zeros if rr is None else np.where(
            reranked > 0, self.component(rr).predict(candidates=reranked), 0.0)
        pool = rows["mmr_pool"]
        select = zeros if not np.any(pool > 0) else np.where(
            pool > 0, self.component(f"mmr:dense-{config.dense_index}").predict(pool=pool), 0.0)
        generate = np.asarray(self.component(self.generate_name(config)).predict(
            tokens_in=rows["tokens_in"], tokens_out=rows["tokens_out"])) + zeros
        out = {"retrieve_ms": retrieve, "rerank_ms": np.asarray(rerank, dtype=np.float64),
               "select_ms": np.asarray(select, dtype=np.float64), "generate_ms": generate}
        out["latency_ms"] = sum(out[c] for c in STAGE_COLUMNS)
        return out
