"""Offline replay of the interaction log through a candidate config.

    rows, lines = read_log("runs/rollout/interactions.jsonl")   # `ragpilot export-interactions`
    ev = ReplayEvaluator(IndexSet.open("runs/index"), gold=gold_by_question)  # gold: optional
    report = ev.compare(rows, stable="9c1d2e3f4a5b", candidate=RAGConfig.from_yaml(...),
                        source="interactions.jsonl", lines=lines)

Every logged, served (non-shadow, non-failed) request of the stable config is asked again of the
candidate `rag.pipeline.Pipeline` over the served index, so the two arms are paired by request
(the same question) even when the candidate never served a user. Both answers are scored the
same way: the logged stable answer is rebuilt from the row (answer text, citations, and the
context passages its `context_ids` name, resolved in the index's corpus; a missing passage is a
DataError: the wrong index) and scored with `rag.metrics.quality.QualityScorer` like the
candidate's. Per request:

    reward = α·F + β·R − γ·min(latency / T, 2) − δ·min(tokens / C_ref, 2) − λ·w_pii·leaks

the per-query reward of the tuner (`rl.kernel.reward.RewardSpec.per_query`, as
`TunerEvaluator.per_query_reward`) with F = RAGAS faithfulness and R = answer relevancy (NaN =
not scorable, e.g. an abstention: counts 0 in the reward, the spec's per-query rule), weights
and C_ref from `TunerSettings`, T = the latency gate. Latency:
the stable arm's logged per-stage ms (retrieve + rerank + select + generate, else the logged
`pipeline` ms) against the candidate's stage ms measured here after one warm-up question. So
run replays on a machine like the serving replicas and not under load, or the latency term is
biased. `leaks`: PII leaks of each answer by the `pii_leaks` hook (the CLI passes
`serving.pii.leak_count`; without a hook the term is 0). A candidate call that raises is a
failed request (error=1, no quality, no tokens, the time until it raised).

When the served dataset has gold answers for a question (`gold`: normalised question ->
`Example`), EM/F1 of both arms go into `meta["gold"]` with a paired bootstrap CI of the F1
difference. They enter the reward only with `relevancy="f1"` (R = gold answer F1, and only
rows with gold are replayed): RAGAS relevancy of terse extractive answers barely separates
configs (docs/quality.md), gold F1 does.

The result is the project's one report type: `EvaluationReport(kind="offline", paired=True)`
with a paired bootstrap CI of the reward difference and the candidate's gate verdicts, which
`rl.promotion.state_machine.PromotionStateMachine` takes at stage `candidate` exactly like
`rl.promotion.evaluators.OfflineEvaluator`'s. Bad input raises ConfigError (argument) or DataError
(file and line).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.corpus.hygiene import normalise_question
from rag.errors import ConfigError, DataError
from rag.pipeline import STAGES
from rag.types import Answer, Context, Example
from rl.kernel.reward import RewardSpec
from rl.kernel.settings import Thresholds, TunerSettings
from rl.promotion.evaluators import Arm, EvaluationReport, _Evaluator
from rl.stats.bootstrap import paired_bootstrap

"""Pipeline stages whose logged ms are compared with the candidate's measured ones."""
PiiHook = Callable[[str, str, Sequence[str]], float]
"""(answer, question, context texts) -> PII leaks of the answer."""


# --------------------------------------------------------------------------- reading the log


def read_log(path: str | Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(rows, their 1-based line numbers) of an interaction export (JSONL, blank lines
    skipped). A line that is not a JSON object, or whose `variant_id` is missing or not a
    string, is a DataError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise DataError(str(p), "interaction log does not exist (ragpilot export-interactions "
                                "--out FILE writes one)")
    rows, lines = [], []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(str(p), f"not JSON ({exc.msg} at column {exc.colno})",
                                n) from None
            if not isinstance(rec, dict):
                raise DataError(str(p), f"expected a JSON object (one interaction per line), "
                                        f"got {type(rec).__name__}", n)
            if not isinstance(rec.get("variant_id"), str):
                raise DataError(str(p), "field 'variant_id' missing or not a string (not an "
                                        "interaction export row)", n)
            rows.append(rec)
            lines.append(n)
    return rows, lines


def _bad(source: str, lines: Sequence[int] | None, i: int, key: str, msg: str) -> Exception:
    if lines is not None:
        return DataError(source, f"field {key!r} {msg}", lines[i])
    return ConfigError(f"rows[{i}].{key}", msg)


def stable_rows(rows: Sequence[Mapping[str, Any]], stable: str, *, source: str = "rows",
                lines: Sequence[int] | None = None, limit: int | None = None
                ) -> list[tuple[int, Mapping[str, Any]]]:
    """(position, row) of every replayable row: served by `stable`, not a shadow answer, not a
    failed request; the newest `limit` of them when given. ConfigError naming `stable` when the
    log has no row of that variant, `rows` when none of them is replayable."""
    if not isinstance(stable, str) or not stable:
        raise ConfigError("stable", "must be the stable config hash (variant id)")
    if limit is not None and limit < 1:
        raise ConfigError("limit", f"must be >= 1, got {limit}")
    if lines is not None and len(lines) != len(rows):
        raise ConfigError("lines", f"{len(lines)} line numbers for {len(rows)} rows")
    if not rows:
        raise ConfigError("rows", f"{source} holds no interactions")
    variants = Counter(str(r.get("variant_id")) for r in rows)
    if stable not in variants:
        seen = ", ".join(f"{v} ({n} rows)" for v, n in variants.most_common(5))
        raise ConfigError("stable", f"no row of {source} was served by {stable!r} "
                                    f"(variants in the log: {seen})")
    picked = [(i, r) for i, r in enumerate(rows) if r.get("variant_id") == stable
              and not r.get("shadow") and not r.get("error")]
    if not picked:
        raise ConfigError("rows", f"{source} has {variants[stable]} rows of {stable!r} but "
                                  "none is replayable (all shadow answers or failed requests)")
    for i, r in picked:
        if not isinstance(r.get("question"), str) or not r["question"].strip():
            raise _bad(source, lines, i, "question", "missing or empty")
        if not isinstance(r.get("answer"), str):
            raise _bad(source, lines, i, "answer", "missing or not a string")
        ids = r.get("context_ids")
        if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
            raise _bad(source, lines, i, "context_ids", "must be a list of passage ids")
        cites = r.get("citations") or []
        if not isinstance(cites, list) or not all(isinstance(x, int) for x in cites):
            raise _bad(source, lines, i, "citations", "must be a list of 1-based indices")
        lat = r.get("latency_ms")
        if not isinstance(lat, dict) or not lat or not all(
                isinstance(v, int | float) and math.isfinite(v) for v in lat.values()):
            raise _bad(source, lines, i, "latency_ms", "must map stage names to ms")
        for key in ("tokens_in", "tokens_out"):
            if not isinstance(r.get(key, 0), int):
                raise _bad(source, lines, i, key, "must be an integer")
    return picked[-limit:] if limit else picked


def logged_latency_ms(row: Mapping[str, Any]) -> float:
    """A row's pipeline latency: the sum of its stage ms (`STAGES`), else its `pipeline` ms
    (the replica call as the ingress timed it), else the sum of what it holds."""
    lat = row.get("latency_ms") or {}
    stages = [float(lat[s]) for s in STAGES if s in lat]
    if stages:
        return float(sum(stages))
    if "pipeline" in lat:
        return float(lat["pipeline"])
    return float(sum(float(v) for v in lat.values()))


# --------------------------------------------------------------------------- the evaluator

RELEVANCY = ("answer_relevancy", "f1")


class ReplayEvaluator(_Evaluator):
    """Replays logged stable requests through a candidate config (module docstring): paired
    by request, kind "offline". `indexes`: the served `rag.indexset.IndexSet`; `gold`:
    normalised question -> Example (optional); `relevancy`: what plays R, "answer_relevancy"
    (RAGAS, default) or "f1" (gold answer F1: only the rows whose question has gold are
    replayed); `scorer`: a QualityScorer (default: the local one, faithfulness and answer
    relevancy only); `policy`: reward weights and C_ref (default `TunerSettings.defaults()`);
    `pii_leaks` / `pii_weight`: the PII term; `resources`: shared models
    (`rag.pipeline.Resources`). Thresholds (default: the policy's), latency SLO and CI settings
    as for every evaluator (`rl.promotion.evaluators`)."""

    kind = "offline"
    paired = True

    def __init__(self, indexes: Any, *, gold: Mapping[str, Example] | None = None,
                 relevancy: str = "answer_relevancy", scorer: Any = None,
                 policy: TunerSettings | None = None, pii_leaks: PiiHook | None = None,
                 pii_weight: float = 1.0, resources: Any = None,
                 thresholds: Thresholds | None = None, **kwargs: Any):
        self.policy = policy or TunerSettings.defaults()
        thresholds = thresholds or self.policy.thresholds
        kwargs.setdefault("latency_slo_ms", thresholds.p95_latency_ms)
        super().__init__(thresholds, **kwargs)
        if relevancy not in RELEVANCY:
            raise ConfigError("relevancy", f"must be one of {', '.join(RELEVANCY)}, got "
                                           f"{relevancy!r}")
        if not pii_weight >= 0:
            raise ConfigError("pii_weight", f"must be >= 0, got {pii_weight!r}")
        self.indexes, self.gold, self.relevancy = indexes, dict(gold or {}), relevancy
        self.pii_leaks, self.pii_weight = pii_leaks, float(pii_weight)
        self.resources = resources
        self._scorer = scorer

    @property
    def scorer(self) -> Any:
        if self._scorer is None:
            from rag.metrics.quality import QualityScorer

            self._scorer = QualityScorer(metrics=("faithfulness", "answer_relevancy"))
        return self._scorer

    # ---- the two arms ---------------------------------------------------------------------
    def logged_answer(self, row: Mapping[str, Any], stable: str, *, source: str = "rows",
                      line: int | None = None, pos: int = 0) -> Answer:
        """The stable answer a row records, its contexts resolved in the index's corpus."""
        corpus = self.indexes.corpus
        ctxs = []
        for pid in row.get("context_ids") or []:
            if pid not in corpus:
                msg = (f"context id {pid!r} is not a passage of the index at "
                       f"{getattr(self.indexes, 'root', '?')} (replay against the served index)")
                if line is not None:
                    raise DataError(source, msg, line)
                raise ConfigError(f"rows[{pos}].context_ids", msg)
            p = corpus[pid]
            ctxs.append(Context(id=pid, title=p.title, text=p.text))
        lat = {k: float(v) for k, v in (row.get("latency_ms") or {}).items()}
        return Answer(str(row.get("id") or pos), row["question"], row["answer"],
                      tuple(row.get("citations") or ()), tuple(ctxs), (), lat,
                      int(row.get("tokens_in", 0)), int(row.get("tokens_out", 0)), stable)

    def _leaks(self, a: Answer) -> float:
        if self.pii_leaks is None or self.pii_weight == 0 or not a.text:
            return 0.0
        return float(self.pii_leaks(a.text, a.question, [c.text for c in a.contexts]))

    def _arm(self, answers: Sequence[Answer | None], latency: np.ndarray,
             scores: Sequence[Mapping[str, float]], f1: np.ndarray | None
             ) -> tuple[Arm, np.ndarray]:
        """Arm of one config (None answer = a failed request) and its PII leaks."""
        F = np.array([s.get("faithfulness", np.nan) for s in scores], dtype=np.float64)
        R = f1 if f1 is not None else np.array(
            [s.get("answer_relevancy", np.nan) for s in scores], dtype=np.float64)
        tokens = np.array([0.0 if a is None else float(a.tokens_in + a.tokens_out)
                           for a in answers])
        leaks = np.array([0.0 if a is None else self._leaks(a) for a in answers])
        spec = RewardSpec.from_settings(self.policy, self.thresholds, self.pii_weight)
        reward = spec.per_query(F, R, latency, tokens, leaks)
        errors = np.array([a is None for a in answers], dtype=np.float64)
        return Arm(reward, latency, errors, F, R, tokens, spec.quality(F, R)), leaks

    def _replay(self, pipe: Any, logged: Sequence[Answer]
                ) -> tuple[list[Answer | None], np.ndarray, Counter[str]]:
        """The candidate's answers (None: the call raised), stage ms, failures by type."""
        out: list[Answer | None] = []
        ms, failures = [], Counter()
        for a in logged:
            t0 = time.perf_counter()
            try:
                ans = pipe.run(a.question, a.query_id)
            except Exception as exc:  # noqa: BLE001 - a failed request of the candidate
                out.append(None)
                ms.append((time.perf_counter() - t0) * 1000.0)
                failures[type(exc).__name__] += 1
                continue
            out.append(ans)
            ms.append(float(sum(ans.latency_ms.get(s, 0.0) for s in STAGES)))
        return out, np.array(ms), failures

    def compare(self, rows: Sequence[Mapping[str, Any]], stable: str, candidate: RAGConfig, *,
                source: str = "rows", lines: Sequence[int] | None = None,
                limit: int | None = None) -> EvaluationReport:
        """Report of `candidate` (a RAGConfig) against the logged answers of `stable` (its
        config hash / variant id) on the replayable rows of `rows` (newest `limit`)."""
        from rag.metrics.qa import best_em_f1
        from rag.pipeline import Pipeline, Resources

        if not isinstance(candidate, RAGConfig):
            raise ConfigError("candidate", f"must be a RAGConfig, got {type(candidate).__name__}")
        rows = list(rows)
        picked = stable_rows(rows, stable, source=source, lines=lines, limit=limit)
        if self.relevancy == "f1":
            n = len(picked)
            picked = [(i, r) for i, r in picked if self._gold(r["question"]) is not None]
            if not picked:
                raise ConfigError("relevancy", f"f1 needs gold answers, and none of the {n} "
                                               f"replayable questions of {source} is a question "
                                               "of the served dataset")
        logged = [self.logged_answer(r, stable, source=source, pos=i,
                                     line=None if lines is None else lines[i])
                  for i, r in picked]
        self.resources = self.resources or Resources()
        pipe = Pipeline(self.indexes, candidate, self.resources)
        pipe.run(logged[0].question, "warmup")  # loads models and indexes; a bad config raises
        replayed, c_lat, failures = self._replay(pipe, logged)
        ok = [a for a in replayed if a is not None]
        scored = self.scorer.score_batch(logged + ok, [None] * (len(logged) + len(ok)))
        s_scores, it = scored[: len(logged)], iter(scored[len(logged):])
        c_scores = [{} if a is None else next(it) for a in replayed]
        s_lat = np.array([logged_latency_ms(r) for _, r in picked])

        gold = [self._gold(a.question) for a in logged]
        have = [j for j, e in enumerate(gold) if e is not None]

        def em_f1(arm: Sequence[Answer | None]) -> np.ndarray:
            return np.array([(0.0, 0.0) if arm[j] is None
                             else best_em_f1(arm[j].text, gold[j].answers)[:2]  # type: ignore
                             for j in have]).reshape(-1, 2)

        s_g, c_g = em_f1(logged), em_f1(replayed)
        f1 = self.relevancy == "f1"
        s_arm, s_leaks = self._arm(logged, s_lat, s_scores, s_g[:, 1] if f1 else None)
        c_arm, c_leaks = self._arm(replayed, c_lat, c_scores, c_g[:, 1] if f1 else None)

        meta: dict[str, Any] = {
            "estimator": "replay", "source": source, "rows": len(picked),
            "stable_hash": stable, "candidate_hash": candidate.config_hash,
            "skipped_rows": len(rows) - len(picked), "candidate_failures": dict(failures),
            "metrics": {"faithfulness": "ragas faithfulness (rag.metrics.quality)",
                        "relevancy": "gold answer F1 (rag.metrics.qa)" if f1 else
                        "ragas answer_relevancy (rag.metrics.quality)"},
            "latency": {"stable": "logged stage ms", "candidate": "stage ms measured here",
                        "stable_p50_ms": float(np.median(s_lat)),
                        "candidate_p50_ms": float(np.median(c_lat))},
            "reward_weights": self.policy.reward_weights.model_dump(by_alias=True),
            "cost_ref_tokens": self.policy.cost_ref_tokens}
        if self.pii_leaks is not None:
            meta["pii_leaks"] = {"stable": float(s_leaks.sum()),
                                 "candidate": float(c_leaks.sum()), "weight": self.pii_weight}
        if have:
            g: dict[str, Any] = {"n": len(have), "stable_em": float(s_g[:, 0].mean()),
                                 "stable_f1": float(s_g[:, 1].mean()),
                                 "candidate_em": float(c_g[:, 0].mean()),
                                 "candidate_f1": float(c_g[:, 1].mean()),
                                 "f1_diff": float((c_g[:, 1] - s_g[:, 1]).mean())}
            if len(have) > 1:
                b = paired_bootstrap(s_g[:, 1], c_g[:, 1], self.n_resamples, self.seed, self.ci)
                g.update(f1_ci_low=b.ci_low, f1_ci_high=b.ci_high)
            meta["gold"] = g
        return self.evaluate(s_arm, c_arm, **meta)

    def _gold(self, question: str) -> Example | None:
        e = self.gold.get(normalise_question(question))
        return e if e is not None and e.answers else None
