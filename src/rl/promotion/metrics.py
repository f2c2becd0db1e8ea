"""Promotion judged per metric (Kayenta-style): each metric has a direction, a practical margin,
whether it is critical, required, and whether a gain on it counts toward the objective; each is compared
between candidate and stable with an always-valid confidence sequence
(`rl.stats.always_valid`), so the evidence may be read after every batch.

Per metric, g = candidate − stable oriented so that positive is better (direction `lower`
flips the sign), with its confidence sequence [low, high] at the stage's `alpha`:

    worse         high < −margin   (significantly worse than the margin allows)
    better        low > 0          (significantly better; Bonferroni over the objective metrics)
    non_inferior  low > −margin    (not worse than the margin, at this confidence)
    pending       none of these yet (or fewer than `verdict_floor(min_n)` observations)
    unmeasured    no observation of this metric in this stage

A paired stage (shadow: both arms answer the same questions) passes when every `required`
metric is shown non-inferior (or better), no metric is worse, and at least one objective metric
is better (the candidate must be better on the objective, not merely equal). The unpaired
canary stages after it are guardrails: they pass once `min_n` candidate requests show no metric
worse (their per-arm spread could not show non-inferiority on a canary's share of traffic).
A pass needs the stage's `min_n` observations; a verdict (a veto included) needs
`verdict_floor(min_n)` = min(min_n, MIN_VERDICT_N), so a canary whose min_n is exposure (500
candidate requests) can still veto a regression as soon as it is shown. A critical metric that
is worse vetoes: the rollout is
rolled back at once. A non-critical worse metric blocks the pass. `judged_on` says which
evidence a metric is judged on: `paired` (mirrored requests only: quality), `served` (served
requests only, i.e. the canary stages: latency, whose time on a mirrored request is confounded
by the mirroring itself, and user feedback, which mirrored answers never get) or `both`.
`margin` is in the metric's units, or, with `relative: true`, a fraction of the stable arm's
mean (e.g. 0.05: 5% more tokens).

The candidate stage judges its offline report (a replay: one look at a fixed paired sample)
with the same rules and `sequential=False`: normal intervals instead of confidence sequences.

Observations come as sufficient statistics (`MetricStats`): paired ones (mirrored requests:
the same question answered by both arms) carry the sums of the per-request differences;
unpaired ones (a live split) carry each arm's sums. Everything here is pure arithmetic on
numpy arrays, so the rollout simulation judges thousands of rollouts at once with the same
code the state machine runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import Field
from scipy.special import ndtri

from rag.errors import ConfigError
from rag.settings_base import StrictSettings
from rl.stats.always_valid import mean_se, paired_cs, required_n, rho2_for, unpaired_cs

VERDICTS = ("worse", "pending", "non_inferior", "better", "unmeasured")
WORSE, PENDING, NON_INFERIOR, BETTER, UNMEASURED = range(5)
MIN_VERDICT_N = 30
"""Observations before any verdict: the confidence sequences are asymptotic."""


def verdict_floor(min_n: int) -> int:
    """Observations a stage with `min_n` needs before a metric's verdict: min(min_n,
    MIN_VERDICT_N). A stage's `min_n` above the floor is exposure before a pass, not a wait
    before a veto."""
    return min(int(min_n), MIN_VERDICT_N)


class MetricRule(StrictSettings):
    """How one metric is judged (module doc)."""

    direction: Literal["higher", "lower"]
    """Which way is better: quality and feedback higher; tokens, latency, errors lower."""
    margin: float = Field(0.0, ge=0.0)
    """Practical margin: the candidate may be worse by at most this (metric units, or a
    fraction of the stable mean when `relative`)."""
    relative: bool = False
    critical: bool = False
    """A significant failure (worse by more than the margin) rolls back at once."""
    required: bool = False
    """A paired stage passes only once this metric is shown non-inferior (pending or
    unmeasured blocks); other metrics, and every metric in an unpaired stage, block only when
    shown worse."""
    objective: bool = False
    """A significant improvement here makes the candidate better on the objective."""
    judged_on: Literal["paired", "served", "both"] = "both"
    """Which evidence judges this metric. `paired`: mirrored request pairs only (shadow; the
    canaries' per-arm spread would need far more traffic, so they rely on shadow's verdict).
    `served`: served requests only (the canary stages' live split, every request): a mirrored
    answer starts after the served one returns and shares replicas and cores with the next
    request, so its timing measures the mirroring, not the config. `both`: every stage."""


@dataclass
class MetricStats:
    """Running sufficient statistics of one metric in one stage. Candidate arm `n, sum,
    sumsq`; stable arm `s_n, s_sum, s_sumsq`; for paired observations also the per-request
    differences' `d_sum, d_sumsq` (then n = s_n = the number of pairs)."""

    paired: bool
    n: float = 0.0
    sum: float = 0.0
    sumsq: float = 0.0
    s_n: float = 0.0
    s_sum: float = 0.0
    s_sumsq: float = 0.0
    d_sum: float = 0.0
    d_sumsq: float = 0.0

    @classmethod
    def of_pairs(cls, stable: ArrayLike, candidate: ArrayLike) -> MetricStats:
        """Statistics of paired observations (NaN pairs dropped)."""
        s, c = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (stable, candidate))
        if s.size != c.size:
            raise ConfigError("candidate", f"paired metric needs equal lengths, got {c.size} "
                                           f"and stable {s.size}")
        keep = ~(np.isnan(s) | np.isnan(c))
        s, c = s[keep], c[keep]
        d = c - s
        return cls(True, float(c.size), float(c.sum()), float(c @ c), float(s.size),
                   float(s.sum()), float(s @ s), float(d.sum()), float(d @ d))

    @classmethod
    def of_arms(cls, stable: ArrayLike, candidate: ArrayLike) -> MetricStats:
        """Statistics of two independent samples (NaN dropped)."""
        s, c = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (stable, candidate))
        s, c = s[~np.isnan(s)], c[~np.isnan(c)]
        return cls(False, float(c.size), float(c.sum()), float(c @ c), float(s.size),
                   float(s.sum()), float(s @ s))

    def __add__(self, other: MetricStats) -> MetricStats:
        if self.paired != other.paired:
            raise ConfigError("metrics", "cannot add paired and unpaired statistics")
        a, b = asdict(self), asdict(other)
        return MetricStats(self.paired, **{k: a[k] + b[k] for k in a if k != "paired"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], field: str = "metrics") -> MetricStats:
        """Inverse of `to_dict`; ConfigError `field.<key>` for a missing or non-finite
        number, a negative count, or a count above another arm's where pairs need equal."""
        if not isinstance(d, Mapping) or not isinstance(d.get("paired"), bool):
            raise ConfigError(f"{field}.paired", "must be true or false")
        out: dict[str, float] = {}
        for k in ("n", "sum", "sumsq", "s_n", "s_sum", "s_sumsq", "d_sum", "d_sumsq"):
            v = d.get(k, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{field}.{k}", f"must be a finite number, got {v!r}")
            if k in ("n", "s_n", "sumsq", "s_sumsq", "d_sumsq") and v < 0:
                raise ConfigError(f"{field}.{k}", f"must be >= 0, got {v!r}")
            out[k] = float(v)
        if d["paired"] and out["n"] != out["s_n"]:
            raise ConfigError(f"{field}.s_n", "paired statistics need n == s_n")
        return cls(d["paired"], **out)


def margin_of(rule: MetricRule, stable_mean: ArrayLike) -> np.ndarray:
    """The rule's margin in metric units (relative margins scale |stable mean|)."""
    m = np.abs(np.asarray(stable_mean, dtype=np.float64))
    return np.nan_to_num(rule.margin * m) if rule.relative else np.full_like(m, rule.margin)


def _interval(paired: bool, c: tuple, s: tuple, d: tuple | None, alpha: float, rho2: float,
              sequential: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(difference candidate − stable, low, high) at `alpha` (two-sided): the always-valid
    confidence sequence when `sequential`, else the one-look normal interval
    difference ± z(1 − alpha/2)·se."""
    if sequential:
        if paired:
            assert d is not None
            return paired_cs(c[0], d[0], d[1], alpha, rho2)
        return unpaired_cs(*c, *s, alpha, rho2)
    if paired:
        assert d is not None
        diff, se = mean_se(c[0], d[0], d[1])
    else:
        (mc, sec), (ms, ses) = mean_se(*c), mean_se(*s)
        diff, se = mc - ms, np.sqrt(sec * sec + ses * ses)
    r = float(ndtri(1.0 - alpha / 2.0)) * se
    return diff, diff - r, diff + r


def verdicts(rule: MetricRule, paired: bool, c: tuple, s: tuple, d: tuple | None,
             alpha: float, rho2: float, min_n: int,
             better_alpha: float | None = None, sequential: bool = True
             ) -> dict[str, np.ndarray]:
    """Vectorised verdict codes (WORSE ... UNMEASURED) of one metric. `c`, `s`: (n, sum,
    sumsq) of each arm (arrays or numbers); `d`: (sum, sumsq) of the paired differences.
    Returns arrays `verdict`, `g` (oriented difference, better > 0), `low`, `high` (its
    interval at `alpha`: the always-valid confidence sequence, or with `sequential=False` the
    one-look normal interval of a fixed sample), `low_better` (its lower bound at
    `better_alpha`, default `alpha`: what `better` needs above 0), `margin` (metric units),
    `n`."""
    n = np.asarray(c[0], dtype=np.float64)
    b_alpha = better_alpha or alpha
    diff, lo, hi = _interval(paired, c, s, d, alpha, rho2, sequential)
    _, lo_b, hi_b = _interval(paired, c, s, d, b_alpha, rho2, sequential)
    if rule.direction == "lower":
        diff, lo, hi, lo_b = -diff, -hi, -lo, -hi_b
    s_n = np.asarray(s[0], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        s_mean = np.where(s_n > 0, np.asarray(s[1], dtype=np.float64) / np.maximum(s_n, 1),
                          np.nan)
    margin = margin_of(rule, s_mean)
    v = np.full(np.broadcast(n, diff).shape, PENDING, dtype=np.int64)
    v = np.where(lo > -margin, NON_INFERIOR, v)
    v = np.where(lo_b > 0, BETTER, v)
    v = np.where(hi < -margin, WORSE, v)
    v = np.where(n < min_n, PENDING, v)
    v = np.where(n < 1, UNMEASURED, v)
    return {"verdict": v, "g": diff, "low": lo, "high": hi, "low_better": lo_b,
            "margin": margin, "n": n}


def stage_decision(rules: Mapping[str, MetricRule], judged: Mapping[str, Mapping[str, Any]],
                   paired: bool, min_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised decision over metrics: (`veto`, `passed`) boolean arrays (module doc).
    veto: a critical metric is worse. passed: no metric worse and, in a `paired` stage, every
    required metric non-inferior or better and an objective metric better; in an unpaired
    stage, at least `min_n` observations of some metric. Metrics missing from `judged` are
    left out (a required one must be judged UNMEASURED to block)."""
    veto = blocked = any_better = enough = None
    for name, rule in rules.items():
        if name not in judged:
            continue
        v, n = np.asarray(judged[name]["verdict"]), np.asarray(judged[name]["n"])
        if veto is None:
            veto = blocked = any_better = enough = np.zeros(v.shape, dtype=bool)
        if rule.critical:
            veto = veto | (v == WORSE)
        blocked = blocked | (v == WORSE)
        if paired and rule.required:
            blocked = blocked | (v == PENDING) | (v == UNMEASURED)
        if rule.objective:
            any_better = any_better | (v == BETTER)
        enough = enough | (n >= min_n)
    if veto is None:
        return np.asarray(False), np.asarray(False)
    passed = ~veto & ~blocked & enough & (any_better if paired else True)
    return veto, passed


@dataclass(frozen=True)
class Judgement:
    """One metric's verdict in a stage, as the state machine records it: `verdict` (VERDICTS),
    `n` observations (pairs, or candidate requests), `diff` candidate − stable (metric units,
    not oriented), its confidence sequence [`low`, `high`], the margin in metric units, and
    whether the metric is critical / an objective. `statistic`: one line for people."""

    metric: str
    verdict: str
    paired: bool
    n: int
    diff: float | None
    low: float | None
    high: float | None
    margin: float
    critical: bool
    objective: bool
    statistic: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _f(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def judge(rules: Mapping[str, MetricRule], stats: Mapping[str, MetricStats], alpha: float,
          n_plan: int, min_n: int, sequential: bool = True
          ) -> tuple[list[Judgement], str, str]:
    """Judge one stage: per-metric `Judgement`s, the decision `pass` | `veto` | `continue`,
    and why (naming the metrics that decided or are missing). `n_plan` tunes the confidence
    sequences (tightest there: the stage's `max_n`); `better` uses alpha / (number of measured
    objective metrics) (Bonferroni), the other bounds `alpha`. `sequential=False` judges one
    look at a fixed sample (the candidate stage's offline replay) with normal intervals
    instead of confidence sequences; the rules and margins are the same."""
    rho2 = rho2_for(max(n_plan, 1), alpha)
    paired = any(st.paired for st in stats.values())
    applies = {k: r for k, r in rules.items()
               if r.judged_on == "both" or (r.judged_on == "paired") == paired}
    n_obj = sum(1 for k, r in applies.items() if r.objective and k in stats and stats[k].n > 0)
    kind = f"always-valid {1 - alpha:.0%} CS" if sequential else f"{1 - alpha:.0%} CI"
    out, judged = [], {}
    for name, rule in applies.items():
        st = stats.get(name, MetricStats(paired))
        j = verdicts(rule, st.paired, (st.n, st.sum, st.sumsq),
                     (st.s_n, st.s_sum, st.s_sumsq), (st.d_sum, st.d_sumsq), alpha, rho2,
                     verdict_floor(min_n), alpha / max(n_obj, 1), sequential)
        judged[name] = j
        v = VERDICTS[int(j["verdict"])]
        sign = 1.0 if rule.direction == "higher" else -1.0
        diff, lo, hi = (_f(sign * j["g"]) if st.n > 0 else None,
                        _f(j["low"] if sign > 0 else -j["high"]),
                        _f(j["high"] if sign > 0 else -j["low"]))
        margin = float(j["margin"])
        text = (f"{name}: {v}" + ("" if diff is None else
                f", Δ {diff:+.4g} (candidate − stable), {kind} "
                f"[{'-inf' if lo is None else f'{lo:+.4g}'}, "
                f"{'inf' if hi is None else f'{hi:+.4g}'}], margin {margin:.4g} "
                f"({'higher' if sign > 0 else 'lower'} is better), n = {int(st.n)}"
                f"{' paired' if st.paired else ''}"))
        out.append(Judgement(name, v, st.paired, int(st.n), diff, lo, hi, margin,
                             rule.critical, rule.objective, text))
    veto, passed = stage_decision(applies, judged, paired, min_n)
    if bool(veto):
        bad = [j.metric for j in out if j.critical and j.verdict == "worse"]
        return out, "veto", f"critical metric worse than its margin: {', '.join(bad)}"
    if bool(passed):
        good = [j.metric for j in out if j.objective and j.verdict == "better"]
        if not paired:
            return out, "pass", (f"no regression in {int(max(j.n for j in out))} requests: "
                                 "no metric worse than its margin")
        return out, "pass", (f"better on {', '.join(good)}, no metric worse than its margin")
    missing = [f"{j.metric} {j.verdict}" for j in out if j.verdict == "worse"
               or (paired and rules[j.metric].required
                   and j.verdict in ("pending", "unmeasured"))]
    if paired and not any(j.objective and j.verdict == "better" for j in out):
        missing.append("no objective metric significantly better yet")
    if not missing:
        missing.append(f"at least {min_n} observations")
    return out, "continue", "needs: " + "; ".join(missing)


def requests_needed(rules: Mapping[str, MetricRule], effects: Mapping[str, float],
                    sds: Mapping[str, float], stable_means: Mapping[str, float], alpha: float,
                    power: float = 0.8) -> dict[str, int | None]:
    """Per metric, the observations its confidence sequence needs to reach its verdict with
    `power` at the offline effect: an objective metric whose effect is better needs to show
    `better` (effect vs 0, at the Bonferroni alpha); every other metric `non_inferior` (effect
    + margin vs 0). `effects` are candidate − stable (metric units), `sds` the per-request sd
    of the paired difference. None where the effect or sd is unknown, or the metric is
    expected to fail."""
    n_obj = sum(1 for k, r in rules.items() if r.objective and k in effects)
    out: dict[str, int | None] = {}
    for name, rule in rules.items():
        e, sd = effects.get(name), sds.get(name)
        if e is None or sd is None or not (math.isfinite(e) and math.isfinite(sd)):
            out[name] = None
            continue
        g = e if rule.direction == "higher" else -e
        m = float(margin_of(rule, stable_means.get(name, float("nan"))))
        if rule.objective and g > 0:
            out[name] = required_n(g, sd, alpha / max(n_obj, 1), power)
        elif g + m > 0:
            out[name] = required_n(g + m, sd, alpha, power)
        else:
            out[name] = None
    return out
