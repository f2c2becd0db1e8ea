"""Adapters from logged interactions (`serving.store.InteractionStore.export_jsonl` rows, plain
dicts) to the evaluators of `rl.promotion.evaluators`: the (stable, candidate) arms of a
shadow or canary batch, and the OPE gate of a new per-query policy (`policy_from_log`: doubly
robust from the logged propensities, with a margin)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rag.errors import ConfigError
from rl.kernel.settings import Thresholds
from rl.promotion.evaluators import (
    QUALITY_SOURCES,
    Arm,
    EvaluationReport,
    Kind,
    _gates,
    _summary,
)

# --------------------------------------------------------------------------- log adapter


QUALITY_SCORES = ("support", "f1")
"""Default row scores averaged into a request's quality (`PromotionSettings.quality_scores`)."""
SIGNAL_QUALITY = QUALITY_SOURCES[1]
"""`sig_combined`: the reference-free score (rag.metrics.signals) a request's quality falls back
to when it has no gold-based score; the Serve app stores it on every request whose question
has no gold."""


def row_quality(r: Mapping[str, Any], keys: Sequence[str] = QUALITY_SCORES) -> float:
    """A logged request's gold-based quality: the mean of its `scores[k]` for the keys present
    (NaN when none is)."""
    sc = r.get("scores") or {}
    got = [float(sc[k]) for k in keys if sc.get(k) is not None and math.isfinite(float(sc[k]))]
    return float(np.mean(got)) if got else float("nan")


def scored_quality(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = QUALITY_SCORES
                   ) -> tuple[list[float], str]:
    """The one quality rule of the rollout, for one request (`rows` = [row]) or one mirrored
    pair (`rows` = [stable row, candidate row]): the gold-based quality (`row_quality` over
    `keys`) when every row has it, else `sig_combined` when every row has it, else nothing.
    Returns (one value per row, NaN when excluded; the source, one of QUALITY_SOURCES)."""
    gold = [row_quality(r, keys) for r in rows]
    if not any(math.isnan(v) for v in gold):
        return gold, "gold"
    sig = [row_quality(r, (SIGNAL_QUALITY,)) for r in rows]
    if not any(math.isnan(v) for v in sig):
        return sig, SIGNAL_QUALITY
    return [float("nan")] * len(rows), "none"


def _row_reward(r: Mapping[str, Any], reward_key: str | None,
                quality_scores: Sequence[str] | None = None) -> float:
    """`scores[reward_key]` when given and present, else the user's feedback `reward`, else
    (with `quality_scores`) the row's quality, else NaN."""
    if reward_key:
        v = (r.get("scores") or {}).get(reward_key)
        if v is not None:
            return float(v)
    if r.get("reward") is not None:
        return float(r["reward"])
    return row_quality(r, quality_scores) if quality_scores else float("nan")


def row_latency_ms(r: Mapping[str, Any]) -> float:
    """End-to-end latency of a logged row: the ingress's `pipeline` time (the replica call as
    the user waited for it, stages included) when present, else the sum of the stage times.
    Summing everything would count the stages twice."""
    lat = r.get("latency_ms") or {}
    if "pipeline" in lat:
        return float(lat["pipeline"])
    return float(sum(lat.values()))


def row_compute_ms(r: Mapping[str, Any]) -> float:
    """A logged row's compute time: the sum of its stage times as the replica measured them
    (without the ingress's `pipeline` wall time, and without `signals`, the time the replica
    spent scoring the answer: a measurement, cheaper for the mirrored answer whose passages the
    served one just encoded); the `pipeline` time when no stage was recorded."""
    lat = r.get("latency_ms") or {}
    stages = [float(v) for k, v in lat.items() if k not in ("pipeline", "signals")]
    return float(sum(stages)) if stages else float(lat.get("pipeline", np.nan))


def _row_arm(rows: list[Mapping[str, Any]], reward_key: str | None = None,
             quality_scores: Sequence[str] = QUALITY_SCORES) -> Arm:
    def score(key: str) -> list[float]:
        return [float((r.get("scores") or {}).get(key, np.nan)) for r in rows]

    return Arm([_row_reward(r, reward_key, quality_scores) for r in rows],
               [row_latency_ms(r) for r in rows],
               [bool(r.get("error", False)) for r in rows], score("faithfulness"),
               score("relevancy"),
               [float(r.get("tokens_in", 0) + r.get("tokens_out", 0)) for r in rows],
               [row_quality(r, quality_scores) for r in rows],
               [np.nan if r.get("reward") is None else float(r["reward"]) for r in rows])


def _filled(values: Any) -> np.ndarray:
    """`values` with NaN replaced by the mean of the others (0 when all are NaN)."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    return np.where(ok, v, float(v[ok].mean()) if ok.any() else 0.0)


def arms_from_rows(rows: Iterable[Mapping[str, Any]], stable: str, candidate: str,
                   kind: Kind, reward_key: str | None = None,
                   quality_scores: Sequence[str] = QUALITY_SCORES
                   ) -> tuple[Arm, Arm, dict[str, int]]:
    """(stable, candidate) arms from `InteractionStore.export_jsonl` rows, and how their quality
    was judged: `{source: count}` over QUALITY_SOURCES (shadow: pairs; canary: requests).

    shadow: each shadow row of the candidate is paired with the served stable row it mirrors
    (`parent_id`): the same question answered by both; canary: served rows per variant. Every
    row counts (cost, latency and errors are measured on every request); per request the
    arms carry quality (`scored_quality`: a pair is compared on the gold-based
    `quality_scores` when both rows have them, else on `sig_combined` when both have it, else
    it is left out of quality and counted under `none`; a canary request likewise on its own),
    tokens, latency (canary: `row_latency_ms`, what the user waited; shadow pairs:
    `row_compute_ms`, the replica's stage times, since a mirrored answer's wall time includes
    queueing behind the served one; on pairs it feeds only the p95 gate and the SLO burn, the
    latency metric is judged on served requests, `MetricRule.judged_on`), error and the user's
    feedback (NaN when unrated; a mirrored answer is never shown, so shadow pairs have none).
    The scalar `reward` (shown, not judged) is `scores[reward_key]`, else the feedback
    (canary), else the quality; a row with none of these takes its arm's mean (0 when no row
    of the arm has one)."""
    rows = list(rows)
    qs = tuple(quality_scores)
    counts = dict.fromkeys(QUALITY_SOURCES, 0)
    if kind == "shadow":
        served = {r["id"]: r for r in rows if not r.get("shadow") and r.get("variant_id") == stable}
        pairs = [(served[r["parent_id"]], r) for r in rows
                 if r.get("shadow") and r.get("variant_id") == candidate
                 and r.get("parent_id") in served]
        if not pairs:
            raise ConfigError("rows", f"no shadow pairs of {candidate} against {stable}")
        quality = []
        for s, c in pairs:
            q, source = scored_quality([s, c], qs)
            quality.append(q)
            counts[source] += 1

        def arm(got: list[Mapping[str, Any]], q: list[float]) -> Arm:
            # latency of a pair is compute time: a mirrored answer is started after the served
            # one returns and queues beside it in the same replicas, so its wall time measures
            # the mirroring, not the config (the latency metric is judged at the canaries)
            a = _row_arm(got, reward_key, qs)
            rew = [_row_reward({**r, "reward": None}, reward_key) for r in got]
            rew = [v if not math.isnan(v) else x for v, x in zip(rew, q, strict=True)]
            return replace(a, reward=_filled(rew), quality=q,
                           latency_ms=[row_compute_ms(r) for r in got])

        return (arm([s for s, _ in pairs], [q[0] for q in quality]),
                arm([c for _, c in pairs], [q[1] for q in quality]), counts)
    if kind != "canary":
        raise ConfigError("kind", f"must be shadow or canary, got {kind!r}")
    out = []
    for name, variant in (("stable", stable), ("candidate", candidate)):
        got = [r for r in rows if not r.get("shadow") and r.get("variant_id") == variant]
        if not got:
            raise ConfigError(name, f"no rows served by {variant}")
        quality = []
        for r in got:
            (q,), source = scored_quality([r], qs)
            quality.append(q)
            counts[source] += 1
        a = _row_arm(got, reward_key, qs)
        rew = [_row_reward(r, reward_key) for r in got]
        rew = [v if not math.isnan(v) else x for v, x in zip(rew, quality, strict=True)]
        out.append(replace(a, reward=_filled(rew), quality=quality))
    return out[0], out[1], counts


# --------------------------------------------------------------------------- policy OPE gate


def policy_from_log(rows: Iterable[Mapping[str, Any]], candidate_probs: Callable,
                    arm_hashes: Sequence[str], *, stable_value: float | None = None,
                    margin: float = 0.01, reward_key: str | None = None, ci: float = 0.95,
                    thresholds: Thresholds | None = None, n_folds: int = 5, seed: int = 0,
                    latency_slo_ms: float = 500.0) -> EvaluationReport:
    """The offline (candidate-stage) report of a new per-query policy, estimated by doubly
    robust OPE (`rl.stats.ope.doubly_robust`, cross-fitted ridge q̂) from the interaction log
    the serving policy wrote (route `policy`, serving.routes_policy).

    `rows`: `export_jsonl` rows; used: served (non-shadow) rows with a reward (`scores[
    reward_key]` when given, else the feedback), a propensity and `features.policy_x`, whose
    `variant_id` is one of the candidate's arms `arm_hashes` (config hashes, arm order).
    `candidate_probs(X)` -> (n, len(arm_hashes)) action probabilities of the candidate.
    `stable_value`: the stable (logging) policy's value; default = the mean logged reward
    (on-policy), or, when the log was written with a candidate explored beside the served
    policy (rows with `features.policy_candidate_id`, serving.policy_router), the DR estimate
    of the served policy's greedy choice (`features.policy_greedy_arm`): the logged mean would
    then mix in the candidate's own share (`meta.stable_estimator` says which); the report's
    `diff` and CI are then the paired DR difference of the two (same rounds, same q̂), so the
    stable estimate's own error is in the interval. The report's `diff` = V_DR(candidate) − stable_value and its CI is the DR
    interval shifted by the same amount, so `ci_low` >= −`margin` says: the DR lower bound is
    at least the stable value minus the margin. `meta.margin` carries the margin to the state
    machine, which then lets the candidate into shadow on exactly that condition. The arm
    summaries (gates, latency) are the logged rows whose arm is the candidate's greedy choice
    (candidate) and all used rows (stable)."""
    from rl.stats.ope import BanditLog, doubly_robust, doubly_robust_difference

    if not 0.0 <= margin < 1.0:
        raise ConfigError("margin", f"must be in [0, 1), got {margin}")
    pos = {h: j for j, h in enumerate(arm_hashes)}
    used = [r for r in rows if not r.get("shadow") and r.get("variant_id") in pos
            and (r.get("features") or {}).get("policy_x") is not None
            and not math.isnan(_row_reward(r, reward_key))]
    if len(used) < 2 * n_folds:
        raise ConfigError("rows", f"{len(used)} usable policy-routed rows with a reward; "
                                  f"DR needs at least {2 * n_folds}")
    x = np.asarray([r["features"]["policy_x"] for r in used], dtype=np.float64)
    a = np.asarray([pos[r["variant_id"]] for r in used])
    p = np.asarray([float(r.get("propensity") or 0.0) for r in used])
    rew = np.asarray([_row_reward(r, reward_key) for r in used])
    pi = np.asarray(candidate_probs(x), dtype=np.float64)
    diff = None
    if stable_value is None and any((r.get("features") or {}).get("policy_candidate_id")
                                    for r in used):
        g = [(r.get("features") or {}).get("policy_greedy_arm") for r in used]
        if any(v is None for v in g):
            raise ConfigError("rows", "a log with candidate exploration needs "
                                      "features.policy_greedy_arm on every row to estimate "
                                      "the served policy's value (or pass stable_value)")
        pi_s = np.zeros_like(pi)
        pi_s[np.arange(len(g)), np.asarray(g, dtype=np.int64)] = 1.0
        est, st, diff = doubly_robust_difference(BanditLog(a, p, rew, x), pi, pi_s,
                                                 n_folds=n_folds, seed=seed, ci=ci)
        base, stable_est = st.value, "dr-greedy"
    else:
        est = doubly_robust(BanditLog(a, p, rew, x), pi, n_folds=n_folds, seed=seed, ci=ci)
        if stable_value is not None:
            base, stable_est = float(stable_value), "given"
        else:
            base, stable_est = float(rew.mean()), "on-policy-mean"
    greedy = pi.argmax(axis=1)
    mine = [r for r, g, j in zip(used, greedy, a, strict=True) if g == j] or used
    c = _summary(_row_arm(mine, reward_key).arrays("candidate"), latency_slo_ms)
    s = _summary(_row_arm(used, reward_key).arrays("stable"), latency_slo_ms)
    if diff is None:  # the stable value taken as known: the candidate's CI, shifted
        diff = replace(est, value=est.value - base, ci_low=est.ci_low - base,
                       ci_high=est.ci_high - base)
    return EvaluationReport(
        "offline", False, c, s, diff.value, diff.se, diff.ci_low, diff.ci_high,
        _gates(c, thresholds or Thresholds()), ci, "dr-normal",
        meta={"estimator": "dr", "margin": margin, "rows": len(used),
              "candidate_value": est.value, "stable_value": base, "ess": est.ess,
              "stable_estimator": stable_est,
              "min_propensity": float(p.min())})
