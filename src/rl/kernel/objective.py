"""Objectives as a user states them: which evaluated config becomes the operating point, and
how the result is said (`TunerSettings.objective`, `rl.kernel.settings.Objective`).

Everything here reads per-query columns (`columns`): one float per query of one split, the
same queries in the same order for every config, so each comparison is paired:
    quality          q = (αF + βR) / (α + β) per query, in [0, 1] (`RewardSpec.quality`
                     scaled; a query missing F or R scores by the other, one with neither 0)
    <F>, <R>         the dataset's faithfulness and relevancy metrics (e.g. support, f1)
    recall@10, ndcg@10  fixed-depth retrieval metrics, where the rows have them (comparable
                     across configs, unlike recall@k at each config's own k)
    tokens           tokens per query (in + out): the cost
    latency_ms       per-query latency (ms) from the cost model; compared as its p95
    error            1 for a failed query, where the rows record it

`paired_deltas` gives, per metric, candidate − baseline with a paired bootstrap over queries
(the same resampled queries for every metric): a two-sided 95% CI and the one-sided `level`
bounds (`lcb`, `ucb`) the choice reads. `choose` applies the objective to a set of candidates
against the incumbent on the tuning split; `statement` says a comparison in the objective's
terms ("-38% tokens at non-inferior quality (margin 0.01, ...)"), never as a reward delta.
Errors: ValueError for columns of different lengths or an incumbent missing from the
candidates.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rl.kernel.settings import Objective
from rl.stats.bootstrap import bootstrap_statistic

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator

QUALITY = "quality"
COST = "tokens"
LATENCY = "latency_ms"
P95 = "p95_latency_ms"
ERROR = "error"
FIXED_DEPTH = ("recall@10", "ndcg@10")
"""Fixed-depth retrieval metrics reported beside F and R when the rows have them."""

Columns = dict[str, np.ndarray]


def columns(ev: TunerEvaluator, tab: Mapping[str, np.ndarray]) -> Columns:
    """The per-query columns (module docstring) of a tuner table `tab` of evaluator `ev`
    (`rl.kernel.evaluator.TunerEvaluator`: its F/R names, abstention rule and weights)."""
    F, R = ev.quality(tab)
    spec = ev.reward_spec()
    w = spec.weights
    q = np.asarray(spec.quality(F, R), dtype=np.float64) / max(w.alpha + w.beta, 1e-12)
    out: Columns = {QUALITY: q, ev.slice.faithfulness: np.asarray(F, dtype=np.float64),
                    ev.slice.relevancy: np.asarray(R, dtype=np.float64)}
    for m in FIXED_DEPTH:
        if m in tab and m not in out:
            out[m] = np.asarray(tab[m], dtype=np.float64)
    out[COST] = np.asarray(tab["tokens"], dtype=np.float64)
    out[LATENCY] = np.asarray(tab["latency_ms"], dtype=np.float64)
    if ERROR in tab:
        out[ERROR] = np.asarray(tab[ERROR], dtype=np.float64)
    return out


def quality_metrics(cols: Columns) -> list[str]:
    """The quality columns of `cols` (everything but cost, latency and errors), q first."""
    return [m for m in cols if m not in (COST, LATENCY, ERROR)]


@dataclass(frozen=True)
class Delta:
    """candidate − baseline for one metric over the same queries: point values, a two-sided
    95% paired-bootstrap CI [`ci_low`, `ci_high`] and one-sided `level` bounds `lcb`, `ucb`.
    Means are over the queries where both configs have the metric (`n` of them); `p95_latency_ms`
    compares 95th percentiles (ms)."""

    metric: str
    candidate: float
    baseline: float
    diff: float
    ci_low: float
    ci_high: float
    lcb: float
    ucb: float
    n: int
    level: float

    @property
    def relative(self) -> float:
        """`diff` as a fraction of the baseline (NaN when the baseline is 0)."""
        return self.diff / self.baseline if self.baseline else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "relative": self.relative}


def paired_deltas(candidate: Columns, baseline: Columns, n_resamples: int = 2000,
                  seed: int = 0, level: float = 0.95) -> dict[str, Delta]:
    """`Delta` of every metric the two column sets share (latency as `p95_latency_ms`), all
    from one set of paired resamples of the queries."""
    names = [m for m in baseline if m in candidate]
    n = baseline[COST].size
    for m in names:
        if candidate[m].size != n or baseline[m].size != n:
            raise ValueError(f"column {m!r}: {candidate[m].size} candidate vs "
                             f"{baseline[m].size} baseline values for {n} queries")
    diffs = {m: candidate[m] - baseline[m] for m in names if m != LATENCY}

    def stat(idx: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        with warnings.catch_warnings():  # a resample with no query holding a metric: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            for m, d in diffs.items():
                out[m] = np.nanmean(d[idx], axis=1)
        if LATENCY in names:
            out[P95] = (np.percentile(candidate[LATENCY][idx], 95, axis=1)
                        - np.percentile(baseline[LATENCY][idx], 95, axis=1))
        return out

    boot = bootstrap_statistic(stat, n, n_resamples, seed)
    out = {}
    for m in names:
        key = P95 if m == LATENCY else m
        if m == LATENCY:
            c, b = (float(np.percentile(x[LATENCY], 95)) for x in (candidate, baseline))
            k = n
        else:
            ok = ~(np.isnan(candidate[m]) | np.isnan(baseline[m]))
            k = int(ok.sum())
            c, b = ((float(x[m][ok].mean()) if k else math.nan) for x in (candidate, baseline))
        v = boot[key][np.isfinite(boot[key])]
        if v.size:
            lo, hi, lcb, ucb = (float(x) for x in np.quantile(
                v, [0.025, 0.975, 1 - level, level]))
        else:
            lo = hi = lcb = ucb = math.nan
        out[key] = Delta(key, c, b, c - b, lo, hi, lcb, ucb, k, level)
    return out


@dataclass
class Choice:
    """The operating point `choose` picked: `key` (the incumbent's when nothing beats it on
    the objective; then `better` is False), each candidate's deltas against the incumbent on
    the tuning split and a one-line `verdicts[key]` of why it was or was not chosen."""

    kind: str
    key: str
    incumbent: str
    better: bool
    reason: str
    deltas: dict[str, dict[str, Delta]] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)


def _mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def gate_failures(obj: Objective, cand: Columns, d: dict[str, Delta], floors: dict[str, float],
                  p95_slo: float, non_inferior: list[str]) -> list[str]:
    """Why a candidate fails the objective's gates (empty: it passes): a floor on a named
    metric (point mean), non-inferiority (lcb of Δ >= −margin) on each of `non_inferior`, the
    p95 SLO (ms) and the error-rate SLO where errors are recorded."""
    out = []
    for m, floor in floors.items():
        v = _mean(cand[m])
        if not v >= floor:
            out.append(f"{m} {v:.3f} < floor {floor:g}")
    for m in non_inferior:
        if m in d and not d[m].lcb >= -obj.margin:
            out.append(f"{m} not non-inferior (Δ {d[m].diff:+.4f}, {obj.level:.0%} lower "
                       f"bound {d[m].lcb:+.4f} < −{obj.margin:g})")
    p95 = float(np.percentile(cand[LATENCY], 95))
    if not p95 <= p95_slo:
        out.append(f"p95 {p95:.0f} ms > SLO {p95_slo:g} ms")
    if ERROR in cand and not _mean(cand[ERROR]) <= obj.error_rate_slo:
        out.append(f"error rate {_mean(cand[ERROR]):.3f} > SLO {obj.error_rate_slo:g}")
    return out


def choose(obj: Objective, candidates: Mapping[str, Columns], incumbent: str,
           f_name: str, r_name: str, p95_slo: float, *, search_best: str | None = None,
           seed: int = 0) -> Choice:
    """Apply `obj` (`Objective.kind`) to `candidates` (key -> columns on the tuning split;
    must hold `incumbent`): see `rl.kernel.settings.Objective`. `f_name`, `r_name`: the
    columns playing F and R (floors bind only to them); `p95_slo`: the latency SLO, ms;
    `search_best`: the search's own pick, which the `reward` objective takes. Bounds are
    one-sided at `obj.level` from `obj.n_resamples` paired resamples (`seed`)."""
    if incumbent not in candidates:
        raise ValueError(f"the incumbent {incumbent!r} is not among the candidates")
    base = candidates[incumbent]
    floors = {m: v for m, v in obj.quality_floors.items() if m in (f_name, r_name)}
    guarded = [m for m in dict.fromkeys((QUALITY, f_name, r_name)) if m not in floors]
    deltas, verdicts, ok = {}, {}, {}
    for key, cols in candidates.items():
        if key == incumbent:
            continue
        d = paired_deltas(cols, base, obj.n_resamples, seed, obj.level)
        deltas[key] = d
        why = gate_failures(obj, cols, d, floors, p95_slo, guarded)
        if obj.kind == "min_cost" and not d[COST].ucb < 0:
            why.append(f"not cheaper (Δ tokens {d[COST].diff:+.1f}, {obj.level:.0%} upper "
                       f"bound {d[COST].ucb:+.1f})")
        if obj.kind == "max_quality":
            tok = obj.token_budget()
            tok = d[COST].baseline if tok is None else tok
            p95 = obj.budgets.p95_latency_ms
            p95 = d[P95].baseline if p95 is None else p95
            if not d[COST].candidate <= tok:
                why.append(f"tokens {d[COST].candidate:.1f} over the budget {tok:.1f}")
            if not d[P95].candidate <= p95:
                why.append(f"p95 {d[P95].candidate:.0f} ms over the budget {p95:.0f} ms")
            if not d[QUALITY].lcb > 0:
                why.append(f"no quality gain shown (Δ {d[QUALITY].diff:+.4f}, {obj.level:.0%} "
                           f"lower bound {d[QUALITY].lcb:+.4f})")
        verdicts[key] = "; ".join(why) if why else "eligible"
        ok[key] = not why
    verdicts[incumbent] = "incumbent"
    eligible = [k for k in ok if ok[k]]
    if obj.kind == "reward":
        key = search_best if search_best in candidates else incumbent
        reason = ("the search's best by the weighted reward" if key != incumbent
                  else "the search found nothing above the incumbent's reward")
    elif not eligible:
        key = incumbent
        reason = ("no evaluated config was cheaper at non-inferior quality"
                  if obj.kind == "min_cost" else
                  "no evaluated config showed a quality gain within the budgets")
    elif obj.kind == "min_cost":
        key = min(eligible, key=lambda k: (deltas[k][COST].ucb, -deltas[k][QUALITY].lcb))
        reason = (f"the cheapest config non-inferior in quality by its {obj.level:.0%} upper "
                  "bound of Δ tokens")
    else:
        key = max(eligible, key=lambda k: (deltas[k][QUALITY].lcb, -deltas[k][COST].diff))
        reason = f"the highest {obj.level:.0%} lower bound of Δ quality within the budgets"
    if key != incumbent:
        verdicts[key] = "chosen"
    return Choice(obj.kind, key, incumbent, key != incumbent, reason, deltas, verdicts)


def _pct(d: Delta) -> tuple[str, str]:
    """("-38% tokens", "tokens 620 vs 1000, 95% CI [-40%, -36%]") of a tokens `Delta`."""
    b = d.baseline
    if not b:
        return f"{d.diff:+.1f} tokens", f"tokens {d.candidate:.0f} vs {b:.0f}"
    return (f"{d.diff / b:+.0%} tokens", f"tokens {d.candidate:.0f} vs {b:.0f}, 95% CI "
            f"[{d.ci_low / b:+.0%}, {d.ci_high / b:+.0%}]")


def statement(kind: str, d: Mapping[str, Delta], margin: float, level: float = 0.95,
              better: bool = True, reason: str = "") -> str:
    """One line in the objective's terms for deltas `d` (chosen − incumbent; `paired_deltas`),
    e.g. "-38% tokens at non-inferior quality (margin 0.01, Δ quality -0.002, 95% CI [...])"
    or "+0.030 quality (95% CI [...]) at <= the default's cost (...)"; when `better` is False,
    the incumbent stays and `reason` says why."""
    if not better:
        return f"the static default stays: {reason}"
    q, tok, p95 = d[QUALITY], d[COST], d.get(P95)
    head, detail = _pct(tok)
    qtxt = f"Δ quality {q.diff:+.4f}, 95% CI [{q.ci_low:+.4f}, {q.ci_high:+.4f}]"
    ptxt = "" if p95 is None else f", p95 {p95.diff:+.1f} ms"
    if kind == "min_cost":
        held = q.lcb >= -margin
        how = "at non-inferior quality" if held else \
            f"but quality not shown non-inferior ({level:.0%} lower bound {q.lcb:+.4f})"
        return f"{head} {how} (margin {margin:g}, {qtxt}; {detail}{ptxt})"
    if kind == "max_quality":
        cost = ("at ≤ the default's cost" if tok.diff <= 0 and (p95 is None or p95.diff <= 0)
                else "at more than the default's cost")
        return (f"{q.diff:+.4f} quality (95% CI [{q.ci_low:+.4f}, {q.ci_high:+.4f}]) {cost} "
                f"({head}; {detail}{ptxt})")
    return f"weighted reward's pick: {qtxt}; {head}; {detail}{ptxt}"
