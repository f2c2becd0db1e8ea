"""Offline evaluation: a config over a dataset -> predictions, contexts, per-query scores,
summary. The CLI's `eval`, the demo and the benchmarks all go through `evaluate`."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag import progress
from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.pipeline import Pipeline
from rag.types import Answer, Example


@dataclass
class EvalResult:
    """Per-query metric rows plus the means; latency percentiles per stage in ms."""

    config: RAGConfig
    answers: list[Answer]
    rows: list[dict[str, float]]
    summary: dict[str, Any] = field(default_factory=dict)

    def write(self, out_dir: str | Path) -> Path:
        """predictions.jsonl, contexts.jsonl, scores.jsonl, summary.json, summary.csv."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "predictions.jsonl").open("w") as f:
            for a in self.answers:
                f.write(json.dumps({"query_id": a.query_id, "question": a.question,
                                    "answer": a.text, "citations": list(a.citations),
                                    "cited_ids": list(a.cited_ids), "latency_ms": a.latency_ms,
                                    "tokens_in": a.tokens_in, "tokens_out": a.tokens_out,
                                    "config_hash": a.config_hash}, ensure_ascii=False) + "\n")
        with (out / "contexts.jsonl").open("w") as f:
            for a in self.answers:
                f.write(json.dumps({"query_id": a.query_id,
                                    "contexts": [c.to_dict() for c in a.contexts],
                                    "candidates": [h.to_dict() for h in a.candidates]},
                                   ensure_ascii=False) + "\n")
        with (out / "scores.jsonl").open("w") as f:
            for a, r in zip(self.answers, self.rows, strict=True):
                f.write(json.dumps({"query_id": a.query_id, **r}) + "\n")
        (out / "summary.json").write_text(json.dumps(
            {"config": self.config.model_dump(mode="json"), "config_hash":
             self.config.config_hash, **self.summary}, indent=2, sort_keys=True))
        flat = {k: v for k, v in self.summary.items() if isinstance(v, (int, float, str))}
        with (out / "summary.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "value"])
            for k in sorted(flat):
                w.writerow([k, flat[k]])
        return out


def latency_summary(answers: Sequence[Answer]) -> dict[str, float]:
    """p50/p95 per stage and for the total, in ms."""
    out: dict[str, float] = {}
    if not answers:
        return out
    stages = sorted({s for a in answers for s in a.latency_ms})
    for s in [*stages, "total"]:
        vals = np.array([a.total_latency_ms if s == "total" else a.latency_ms.get(s, 0.0)
                         for a in answers])
        out[f"{s}_p50_ms"] = float(np.percentile(vals, 50))
        out[f"{s}_p95_ms"] = float(np.percentile(vals, 95))
    return out


def evaluate(pipeline: Pipeline, examples: Sequence[Example], batch_size: int = 8
             ) -> EvalResult:
    """Answer every example with `pipeline` and score each answer against its gold.

    Before the timed loop the models and indexes the config uses are loaded (the generator and
    reranker by `Pipeline.load_models`, the indexes and query encoder by one untimed retrieval
    of the first question), so no question's latency includes a load: `summary["model_load_s"]`
    reports that time apart; `wall_s` and the per-stage percentiles exclude it. No examples
    is a ConfigError: an evaluation that selected nothing has no score to report. The load,
    the answers (counted per batch) and the scoring are `rag.progress` stages."""
    if not examples:
        raise ConfigError("examples", "nothing to evaluate: the selection holds no questions "
                                    "(check the split, --limit or the filter that made it)")
    if isinstance(examples, (str, bytes)) or not all(isinstance(e, Example) for e in examples):
        raise ConfigError("examples", "expected a sequence of rag.types.Example (e.g. a "
                                      "loaded dataset's .examples)")
    if not isinstance(pipeline, Pipeline):
        raise ConfigError("pipeline", f"expected a rag.pipeline.Pipeline, got "
                                      f"{type(pipeline).__name__}")
    name = f"eval {pipeline.config.config_hash}"
    t_load = time.perf_counter()
    with progress.stage(f"{name}: load models and indexes"):
        pipeline.load_models()
        if examples[0].question.strip():  # warm-up: builds/loads indexes, encoder
            pipeline.retrieve(examples[0].question.strip())
    model_load_s = time.perf_counter() - t_load

    t0 = time.perf_counter()
    with progress.stage(f"{name}: answer", len(examples), "questions") as st:
        answers = pipeline.run_batch([e.question for e in examples], [e.id for e in examples],
                                     batch_size=batch_size, progress=st.update)
    wall = time.perf_counter() - t0
    with progress.stage(f"{name}: score {len(examples)} answers"):
        rows = score_answers(answers, examples, pipeline.config.k)
    return EvalResult(pipeline.config, answers, rows,
                      summarize(answers, rows, wall_s=wall, model_load_s=model_load_s))


def score_answers(answers: Sequence[Answer], examples: Sequence[Example],
                  k: int) -> list[dict[str, float]]:
    """One metric row per (answer, its example), in order (`rag.metrics.score_answer`)."""
    from rag.metrics import score_answer

    return [score_answer(a, e, k=k) for a, e in zip(answers, examples, strict=True)]


def summarize(answers: Sequence[Answer], rows: Sequence[dict[str, float]], *, wall_s: float,
              model_load_s: float) -> dict[str, Any]:
    """The summary of an evaluation: n, wall and load seconds, the metric means
    (`rag.metrics.aggregate`) and the n each was taken over (`n_by_metric`), per-stage latency
    percentiles (ms) and mean tokens. Shared by `evaluate` and the Ray fan-out
    (rl.common.fanout), so both report the same keys."""
    from rag.metrics import aggregate, metric_counts

    return {"n": len(answers), "wall_s": wall_s, "model_load_s": model_load_s,
            **aggregate(list(rows)), "n_by_metric": metric_counts(list(rows)),
            **latency_summary(answers),
            "tokens_in_mean": float(np.mean([a.tokens_in for a in answers]))
            if answers else 0.0,
            "tokens_out_mean": float(np.mean([a.tokens_out for a in answers]))
            if answers else 0.0}
