"""Offline, shadow and canary evaluators with one report type, `EvaluationReport`.

Every evaluator compares a candidate config with the stable one and returns the same record:
per arm (an `ArmSummary`) the mean per-request reward, faithfulness F, relevancy R, p95 latency
(ms), cost (tokens per request), error rate and the count of requests slower than the latency
SLO; the reward difference candidate − stable with a 95% CI; and the candidate's hard-gate
verdicts (`rl.kernel.settings.Thresholds`: F >= threshold, R >= threshold, p95 <= threshold; a metric that
was not measured gives verdict None and does not fail).

- `ShadowEvaluator`: mirrored traffic, so both configs answered the same requests: paired
  (paired bootstrap of b − a, or a normal interval on the differences).
- `CanaryEvaluator`: a live split, different requests per arm: unpaired (independent
  bootstraps of both arms, or Welch's normal interval).
- `OfflineEvaluator`: a dataset split replayed through both configs with the tuner's per-query
  tables (`TunerEvaluator.table` / `per_query_reward`): paired; `rl.promotion.replay
  .ReplayEvaluator` replays a logged interaction export instead. Offline reports carry the
  same per-metric paired statistics (`metrics`) the candidate stage judges.

The shadow and canary evaluators are pure functions of arrays (`Arm`), so they are tested and
simulated without Serve; `rl.promotion.log_evaluators.arms_from_rows` is the thin adapter from
`InteractionStore.export_jsonl` rows. Bad input raises `ConfigError` naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtri

from rag.errors import ConfigError
from rl.kernel.reward import gate_verdicts
from rl.kernel.settings import Thresholds
from rl.stats.bootstrap import paired_bootstrap, unpaired_bootstrap

CIMethod = Literal["bootstrap", "normal"]
Kind = Literal["offline", "shadow", "canary"]


# --------------------------------------------------------------------------- inputs


def _arr(name: str, v: ArrayLike | None, n: int | None = None) -> np.ndarray | None:
    if v is None:
        return None
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if n is not None and a.size != n:
        raise ConfigError(name, f"has {a.size} values, expected {n} (one per request)")
    if np.any(np.isinf(a)):
        raise ConfigError(name, "contains infinite values")
    return a


@dataclass(frozen=True)
class Arm:
    """Per-request observations of one config in one batch. `reward` is required (metric
    units); the rest are optional arrays of the same length: `latency_ms`, `error` (truthy =
    failed request), `faithfulness`, `relevancy`, `quality` (the request's quality score in
    [0, 1]), `feedback` (the user's rating) (NaN = not scored), `cost` (tokens)."""

    reward: ArrayLike
    latency_ms: ArrayLike | None = None
    error: ArrayLike | None = None
    faithfulness: ArrayLike | None = None
    relevancy: ArrayLike | None = None
    cost: ArrayLike | None = None
    quality: ArrayLike | None = None
    feedback: ArrayLike | None = None

    def arrays(self, name: str) -> dict[str, np.ndarray | None]:
        r = _arr(f"{name}.reward", self.reward)
        if r is None or r.size < 1:
            raise ConfigError(f"{name}.reward", "needs at least one request")
        if np.any(np.isnan(r)):
            raise ConfigError(f"{name}.reward", "contains NaN")
        out: dict[str, np.ndarray | None] = {"reward": r}
        for key in ("latency_ms", "error", "faithfulness", "relevancy", "cost", "quality",
                    "feedback"):
            out[key] = _arr(f"{name}.{key}", getattr(self, key), r.size)
        return out


QUALITY_SOURCES = ("gold", "sig_combined", "none")
"""What a request's (or a mirrored pair's) quality was judged on (`meta.quality_on` of a
report from the log, rl.promotion.log_evaluators.scored_quality): the gold-based
`quality_scores`, the reference-free `sig_combined` (rag.metrics.signals), or nothing (left
out of quality, counted)."""

METRIC_ARRAYS = {"quality": "quality", "tokens": "cost", "latency_ms": "latency_ms",
                 "error_rate": "error", "feedback": "feedback"}
"""Per-metric judgement's metric name -> the `Arm` array it reads."""


def metric_stats(stable: dict[str, np.ndarray | None], candidate: dict[str, np.ndarray | None],
                 paired: bool) -> dict[str, dict[str, Any]]:
    """`MetricStats` dicts (rl.promotion.metrics) of every metric both arms measured: of the
    pairs when `paired` (NaN pairs dropped), else of each arm."""
    from rl.promotion.metrics import MetricStats

    out = {}
    for name, key in METRIC_ARRAYS.items():
        s, c = stable[key], candidate[key]
        if s is None or c is None:
            continue
        if key == "error":
            s, c = (np.nan_to_num(x).astype(bool).astype(np.float64) for x in (s, c))
        st = MetricStats.of_pairs(s, c) if paired else MetricStats.of_arms(s, c)
        if st.n > 0 and st.s_n > 0:
            out[name] = st.to_dict()
    return out


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class ArmSummary:
    """One arm of a batch. `errors` / `slow` count failed requests and requests slower than the
    latency SLO (both None when not measured); None metrics were not measured."""

    n: int
    reward: float
    reward_sd: float
    faithfulness: float | None = None
    relevancy: float | None = None
    p95_latency_ms: float | None = None
    cost: float | None = None
    errors: int | None = None
    slow: int | None = None

    @property
    def error_rate(self) -> float | None:
        return None if self.errors is None else self.errors / max(self.n, 1)


@dataclass(frozen=True)
class EvaluationReport:
    """The one report every evaluator returns. `diff` = candidate − stable mean reward with
    interval [`ci_low`, `ci_high`] at level `ci` (`ci_method`), `diff_se` its standard error,
    `diff_sd` the sd of the per-request differences (paired only). `gates`: the candidate's
    hard-gate verdicts (None = not measured); `gates_passed`: no measured gate failed."""

    kind: str
    paired: bool
    candidate: ArmSummary
    stable: ArmSummary
    diff: float
    diff_se: float
    ci_low: float
    ci_high: float
    gates: dict[str, bool | None]
    ci: float = 0.95
    ci_method: str = "normal"
    diff_sd: float | None = None
    p_value: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form context (source, dataset, ...); `quality_on`, when present, is {source:
    count} of what the batch's quality was judged on (`log_evaluators.arms_from_rows`)."""
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per metric (quality, tokens, latency_ms, error_rate, feedback) the batch's sufficient
    statistics (`rl.promotion.metrics.MetricStats.to_dict`): what the tested stages judge."""

    # the candidate's numbers, flat
    @property
    def n(self) -> int:
        return self.candidate.n

    @property
    def reward(self) -> float:
        return self.candidate.reward

    @property
    def faithfulness(self) -> float | None:
        return self.candidate.faithfulness

    @property
    def relevancy(self) -> float | None:
        return self.candidate.relevancy

    @property
    def p95_latency_ms(self) -> float | None:
        return self.candidate.p95_latency_ms

    @property
    def cost(self) -> float | None:
        return self.candidate.cost

    @property
    def gates_passed(self) -> bool:
        return all(v is not False for v in self.gates.values())

    @property
    def failed_gates(self) -> list[str]:
        return [k for k, v in self.gates.items() if v is False]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gates_passed"] = self.gates_passed
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvaluationReport:
        """Inverse of `to_dict` (extra keys such as gates_passed are ignored). Every value is
        checked, since a report may come from a client (`POST /admin/rollout/advance`, an
        evidence file): numbers must be real and finite (an optional arm metric that is NaN
        reads as not measured), `ci_low <= diff <= ci_high` is not required but `ci_low <=
        ci_high` is, counts are whole and within the arm; ConfigError names `report.<key>`."""
        if not isinstance(d, Mapping):
            raise ConfigError("report", f"must be an object, got {type(d).__name__}")
        try:
            data = {k: d[k] for k in ("kind", "paired", "diff", "diff_se", "ci_low", "ci_high",
                                      "gates")}
            arms = {k: _arm_from_dict(d[k], f"report.{k}") for k in ("candidate", "stable")}
        except KeyError as exc:
            raise ConfigError(f"report.{exc.args[0]}", "missing") from None
        opt = {k: d[k] for k in ("ci", "ci_method", "diff_sd", "p_value", "meta", "metrics")
               if k in d}
        if data["kind"] not in ("offline", "shadow", "canary"):
            raise ConfigError("report.kind", f"must be offline|shadow|canary, got "
                                             f"{data['kind']!r}")
        if not isinstance(data["paired"], bool):
            raise ConfigError("report.paired", f"must be true or false, got {data['paired']!r}")
        for k in ("diff", "ci_low", "ci_high"):
            data[k] = _finite(f"report.{k}", data[k])
        data["diff_se"] = _finite("report.diff_se", data["diff_se"], lo=0.0)
        if data["ci_low"] > data["ci_high"]:
            raise ConfigError("report.ci_low", f"is {data['ci_low']:g}, above ci_high "
                                               f"{data['ci_high']:g}")
        gates = data["gates"]
        if not isinstance(gates, Mapping) or not all(
                isinstance(g, str) and (v is None or isinstance(v, bool))
                for g, v in gates.items()):
            raise ConfigError("report.gates", "must map gate names to true, false or null")
        data["gates"] = dict(gates)
        if "ci" in opt:
            opt["ci"] = _finite("report.ci", opt["ci"], lo=0.0, hi=1.0)
        for k, hi in (("diff_sd", None), ("p_value", 1.0)):
            if opt.get(k) is not None:
                opt[k] = _finite(f"report.{k}", opt[k], lo=0.0, hi=hi)
        if "ci_method" in opt and opt["ci_method"] not in ("bootstrap", "normal"):
            raise ConfigError("report.ci_method", f"must be bootstrap|normal, got "
                                                  f"{opt['ci_method']!r}")
        if "meta" in opt and not isinstance(opt["meta"], Mapping):
            raise ConfigError("report.meta", "must be an object")
        on = (opt.get("meta") or {}).get("quality_on")
        if on is not None:
            if not isinstance(on, Mapping):
                raise ConfigError("report.meta.quality_on", "must be an object")
            for k, v in on.items():
                if k not in QUALITY_SOURCES:
                    raise ConfigError(f"report.meta.quality_on.{k}", "unknown quality source; "
                                      f"one of {', '.join(QUALITY_SOURCES)}")
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ConfigError(f"report.meta.quality_on.{k}",
                                      f"must be a whole number >= 0, got {v!r}")
        if "metrics" in opt:
            from rl.promotion.metrics import MetricStats

            if not isinstance(opt["metrics"], Mapping):
                raise ConfigError("report.metrics", "must be an object")
            opt["metrics"] = {str(k): MetricStats.from_dict(v, f"report.metrics.{k}").to_dict()
                              for k, v in opt["metrics"].items()}
        return cls(**data, **arms, **opt)


def _finite(name: str, v: Any, lo: float | None = None, hi: float | None = None) -> float:
    """`v` as a float: a real, finite number within [lo, hi] (bool and strings refused)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(name, f"must be a finite number, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(name, f"is {v!r}; must lie in [{lo if lo is not None else '-inf'}, "
                                f"{hi if hi is not None else 'inf'}]")
    return float(v)


def _arm_from_dict(a: Any, name: str) -> ArmSummary:
    """An ArmSummary from a report's `candidate` / `stable` object, checked like
    `EvaluationReport.from_dict` checks the rest."""
    if not isinstance(a, Mapping):
        raise ConfigError(name, f"must be an object, got {type(a).__name__}")
    unknown = sorted(set(a) - set(ArmSummary.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}", "unknown key")
    for k in ("n", "reward", "reward_sd"):
        if k not in a:
            raise ConfigError(f"{name}.{k}", "missing")
    n = a["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{name}.n", f"must be a whole number >= 1, got {n!r}")
    out: dict[str, Any] = {"n": n, "reward": _finite(f"{name}.reward", a["reward"]),
                           "reward_sd": _finite(f"{name}.reward_sd", a["reward_sd"], lo=0.0)}
    for k in ("faithfulness", "relevancy", "p95_latency_ms", "cost"):
        v = a.get(k)
        if isinstance(v, float) and math.isnan(v):
            v = None  # NaN = not measured, as the evaluators' own arrays say
        out[k] = None if v is None else _finite(f"{name}.{k}", v,
                                                lo=None if k in ("faithfulness",
                                                                 "relevancy") else 0.0)
    for k in ("errors", "slow"):
        v = a.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= n):
            raise ConfigError(f"{name}.{k}", f"must be a whole number in [0, n = {n}], got "
                                             f"{v!r}")
        out[k] = v
    return ArmSummary(**out)


# --------------------------------------------------------------------------- computing


def _summary(a: dict[str, np.ndarray | None], latency_slo_ms: float) -> ArmSummary:
    r = a["reward"]
    assert r is not None

    def mean(key: str) -> float | None:
        v = a[key]
        return None if v is None or np.all(np.isnan(v)) else float(np.nanmean(v))

    lat, err = a["latency_ms"], a["error"]
    return ArmSummary(
        n=int(r.size), reward=float(r.mean()),
        reward_sd=float(r.std(ddof=1)) if r.size > 1 else 0.0,
        faithfulness=mean("faithfulness"), relevancy=mean("relevancy"),
        p95_latency_ms=None if lat is None else float(np.nanpercentile(lat, 95)),
        cost=mean("cost"),
        errors=None if err is None else int(np.count_nonzero(np.nan_to_num(err))),
        slow=None if lat is None else int(np.count_nonzero(lat > latency_slo_ms)))


def _gates(s: ArmSummary, t: Thresholds) -> dict[str, bool | None]:
    """The candidate's hard-gate verdicts (`rl.kernel.reward.gate_verdicts`: None = not
    measured)."""
    return gate_verdicts({"faithfulness": s.faithfulness, "relevancy": s.relevancy,
                          "p95_latency_ms": s.p95_latency_ms}, t)


class _Evaluator:
    """Shared settings: gates, latency SLO (ms, for the slow-request count), CI level/method."""

    kind: Kind = "canary"
    paired = False

    def __init__(self, thresholds: Thresholds | None = None, *, latency_slo_ms: float = 500.0,
                 ci: float = 0.95, ci_method: CIMethod = "bootstrap", n_resamples: int = 10_000,
                 seed: int = 0):
        if ci_method not in ("bootstrap", "normal"):
            raise ConfigError("ci_method", f"must be bootstrap|normal, got {ci_method!r}")
        if not 0 < ci < 1:
            raise ConfigError("ci", f"must be in (0, 1), got {ci}")
        if not latency_slo_ms > 0:
            raise ConfigError("latency_slo_ms", f"must be > 0, got {latency_slo_ms}")
        self.thresholds = thresholds or Thresholds()
        self.latency_slo_ms, self.ci, self.ci_method = latency_slo_ms, ci, ci_method
        self.n_resamples, self.seed = n_resamples, seed

    def evaluate(self, stable: Arm, candidate: Arm, **meta: Any) -> EvaluationReport:
        s, c = stable.arrays("stable"), candidate.arrays("candidate")
        rs, rc = s["reward"], c["reward"]
        assert rs is not None and rc is not None
        z = float(ndtri(0.5 + self.ci / 2))
        diff_sd = p = None
        if self.paired:
            if rs.size != rc.size:
                raise ConfigError("candidate.reward", f"paired batch needs equal lengths, got "
                                                      f"{rc.size} and stable {rs.size}")
            d = rc - rs
            diff = float(d.mean())
            diff_sd = float(d.std(ddof=1)) if d.size > 1 else 0.0
            se = diff_sd / math.sqrt(d.size)
            if self.ci_method == "bootstrap" and d.size > 1:
                b = paired_bootstrap(rs, rc, self.n_resamples, self.seed, self.ci)
                lo, hi, p = b.ci_low, b.ci_high, b.p_value
            else:
                lo, hi = diff - z * se, diff + z * se
        else:
            diff = float(rc.mean() - rs.mean())
            var = sum(float(x.var(ddof=1)) / x.size if x.size > 1 else 0.0 for x in (rs, rc))
            se = math.sqrt(var)
            if self.ci_method == "bootstrap" and min(rs.size, rc.size) > 1:
                b = unpaired_bootstrap(rs, rc, self.n_resamples, self.seed, self.ci)
                lo, hi = b.ci_low, b.ci_high
            else:
                lo, hi = diff - z * se, diff + z * se
        cand = _summary(c, self.latency_slo_ms)
        return EvaluationReport(self.kind, self.paired, cand, _summary(s, self.latency_slo_ms),
                                diff, float(se), float(lo), float(hi),
                                _gates(cand, self.thresholds), self.ci, self.ci_method,
                                diff_sd, p, dict(meta), metric_stats(s, c, self.paired))


class ShadowEvaluator(_Evaluator):
    """Mirrored traffic: request i was answered by both configs (paired)."""

    kind: Kind = "shadow"
    paired = True


class CanaryEvaluator(_Evaluator):
    """Live split: the arms answered different requests (unpaired)."""

    kind: Kind = "canary"
    paired = False


class OfflineEvaluator(_Evaluator):
    """Replay of a dataset split through both configs via `rl.kernel.evaluator.TunerEvaluator`
    per-query tables (computed once, cached): paired by query. Per-request reward is
    `TunerEvaluator.per_query_reward`; F, R, latency and tokens come from the same tables;
    no query failed (a failing query fails the table), so every error is 0."""

    kind: Kind = "offline"
    paired = True

    def __init__(self, tuner_evaluator: Any, **kwargs: Any):
        kwargs.setdefault("thresholds", tuner_evaluator.thresholds)
        kwargs.setdefault("latency_slo_ms", tuner_evaluator.thresholds.p95_latency_ms)
        super().__init__(**kwargs)
        self.ev = tuner_evaluator

    def arm(self, config: Any, split: str | None = None) -> Arm:
        split = split or self.ev.slice.tune_split
        tab = self.ev.table(config, split)
        f, r = self.ev.quality(tab)
        return Arm(self.ev.per_query_reward(tab), tab["latency_ms"],
                   np.zeros(len(tab["tokens"])), f, r, tab["tokens"],
                   self.ev.reward_spec().quality(f, r))

    def compare(self, stable: Any, candidate: Any, split: str | None = None) -> EvaluationReport:
        """Report of `candidate` vs `stable` (RAGConfigs) on `split` (default: the tune split)."""
        split = split or self.ev.slice.tune_split
        return super().evaluate(self.arm(stable, split), self.arm(candidate, split),
                                dataset=self.ev.data.name, split=split,
                                stable_hash=stable.config_hash,
                                candidate_hash=candidate.config_hash)
