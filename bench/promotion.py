"""Promotion simulation: per-metric paired judgement against today's scalar unpaired canary.

    python bench/promotion.py           # 2,000 simulated rollouts per scenario and system
    python bench/promotion.py --quick   # < 2 min: 300 per scenario (writes promotion.quick.*)

Writes bench/results/promotion.{json,md}.

Per-request noise comes from real rows: the tuner evaluator's per-query rows on the synthetic
world (`rl.kernel.evaluator`, both splits, 240 questions; computed once and cached, so run it
under the heavy lock the first time) for the static default config (the stable arm), and for a
second real config (dense retrieval, k = 2) whose per-query differences from the default,
centred and given a random sign per request, are the paired noise of a candidate: quality
(`RewardSpec.quality` of F and R), tokens (in + out) and latency (the stage wall times measured
when the row was built). The random sign makes the noise symmetric, as paired differences of
two exchangeable arms are; centring alone left a skewed mass (97% of the pairs agree). A
simulated request draws one question uniformly; the stable arm answers with the default's row,
the candidate with

    quality  = stable quality + delta_quality + noise_quality
    tokens   = stable tokens · (1 + token_change) + noise_tokens
    latency  = stable latency · (1 + latency_change) + noise_latency

Scenarios (delta_quality, token_change, latency_change): cheaper-equal-quality (0, −30%, 0),
better-quality (+0.05, 0, 0) — good, should be promoted; cheaper-worse-quality (−0.05, −30%,
0), latency-regression (0, −30%, +50%) — harmful; no-difference (0, 0, 0) — no gain. Neither
harmful nor no-gain candidates should be promoted.

Systems, each deciding on the same traffic:
- `per-metric` (new): the rollout of `configs/rl/rollout.yaml` judged per metric by
  `rl.promotion.metrics` (the state machine's code): shadow, every request mirrored to the
  candidate, a look every 10 requests, on the metrics judged on mirrored pairs (quality,
  tokens); then canary_5 and canary_25, a live split, a look every 25 candidate requests, on
  the metrics judged on served requests (tokens, latency). Promoted = every stage passes before
  any veto and before its `max_n`. Requests to decision: until the veto (any stage), else until
  shadow's verdict on the objective; `requests_to_full_median` counts the whole rollout.
- `scalar-unpaired` (today's, before this change): the candidate at 5% of traffic, one per-request
  scalar reward (`RewardSpec.per_query`: quality − γ·latency − δ·tokens) compared unpaired with
  the stable's, the group-sequential test the state machine used (5 looks at 320, ..., 1,600
  candidate requests, O'Brien–Fleming one-sided alpha 0.05 for efficacy, Pocock 0.05 for harm):
  promoted = efficacy before harm.

Metrics: `wrong_promotion_rate` (harmful and no-gain scenarios; target <= 0.05), `power`
(good scenarios; target >= 0.80), `requests_to_decision_median` (all requests served until the
system decided, an undecided run counted at its last look; target: per-metric <= 1/10 of
scalar-unpaired's), each with a 95% CI (Wilson for rates, order statistics for medians).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, write_results  # noqa: E402
from bench.group_sequential import group_sequential_bounds  # noqa: E402
from rl.promotion.metrics import (  # noqa: E402
    VERDICTS,
    stage_decision,
    verdict_floor,
    verdicts,
)
from rl.promotion.settings import DEFAULTS_PATH, PromotionSettings  # noqa: E402
from rl.stats.always_valid import rho2_for  # noqa: E402

SEED = 0
SCENARIOS = {  # delta_quality, token_change, latency_change, kind
    "cheaper-equal-quality": (0.0, -0.30, 0.0, "good"),
    "better-quality": (0.05, 0.0, 0.0, "good"),
    "cheaper-worse-quality": (-0.05, -0.30, 0.0, "harmful"),
    "no-difference": (0.0, 0.0, 0.0, "no-gain"),
    "latency-regression": (0.0, -0.30, 0.50, "harmful"),
}
BATCH = 10
"""Requests between two looks of the per-metric judge in shadow."""
CANARY_LOOK = 25
"""Candidate requests between two looks in a canary stage."""
CANARY_STAGES = (("canary_5", 5.0), ("canary_25", 25.0))
CANARY_PERCENT = 5.0
SCALAR_LOOKS, SCALAR_MAX_N = 5, 1600
"""Today's canary_5 plan (configs/rl/rollout.yaml before per-metric promotion)."""
TARGET_WRONG, TARGET_POWER, TARGET_RATIO = 0.05, 0.80, 0.1


# --------------------------------------------------------------------------- real rows


def real_rows() -> dict[str, dict[str, np.ndarray]]:
    """Per-query quality, tokens and measured latency (ms) of the default and the second
    config on the synthetic world's valid + test splits (module doc)."""
    from rl.kernel.evaluator import get_evaluator
    from rl.kernel.settings import TunerSettings
    from rl.kernel.space import ConfigSpace

    settings = TunerSettings.defaults()
    default = ConfigSpace(settings).base
    configs = {"default": default,
               "other": default.model_copy(update={"variant": "dense", "k": 2})}
    ev = get_evaluator("synthetic", settings)
    spec = ev.reward_spec()
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, cfg in configs.items():
        cols: dict[str, list[np.ndarray]] = {"quality": [], "tokens": [], "latency_ms": []}
        for split in ("valid", "test"):
            print(f"  rows: {name} ({cfg.config_hash}) on synthetic/{split}", flush=True)
            tab = ev.table(cfg, split)
            f, r = ev.quality(tab)
            cols["quality"].append(np.asarray(spec.quality(f, r), dtype=np.float64))
            cols["tokens"].append(tab["tokens"])
            cols["latency_ms"].append(sum(tab[c] for c in tab if c.startswith("measured_")
                                          and c.endswith("_ms")))
        out[name] = {k: np.concatenate(v) for k, v in cols.items()}
        out[name]["hash"] = cfg.config_hash  # type: ignore[assignment]
    return out


class Traffic:
    """Simulated requests of one scenario (module doc): `draw(runs, n)` -> stable and
    candidate arrays per metric, shape (runs, n)."""

    def __init__(self, rows: dict, scenario: tuple, rng: np.random.Generator):
        self.s = {k: rows["default"][k] for k in ("quality", "tokens", "latency_ms")}
        diff = {k: rows["other"][k] - self.s[k] for k in self.s}
        self.noise = {k: v - v.mean() for k, v in diff.items()}
        self.dq, self.dt, self.dl, _ = scenario
        self.rng, self.n_q = rng, self.s["quality"].size

    def draw(self, runs: int, n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        j = self.rng.integers(0, self.n_q, size=(runs, n))
        sign = np.where(self.rng.random((runs, n)) < 0.5, -1.0, 1.0)
        s = {k: v[j] for k, v in self.s.items()}
        e = {k: sign * v[j] for k, v in self.noise.items()}
        c = {"quality": s["quality"] + self.dq + e["quality"],
             "tokens": s["tokens"] * (1 + self.dt) + e["tokens"],
             "latency_ms": s["latency_ms"] * (1 + self.dl) + e["latency_ms"]}
        return s, c

    def stable_only(self, runs: int, n: int) -> dict[str, np.ndarray]:
        j = self.rng.integers(0, self.n_q, size=(runs, n))
        return {k: v[j] for k, v in self.s.items()}


# --------------------------------------------------------------------------- systems


def _stage_rules(cfg: PromotionSettings, paired: bool) -> dict:
    """The simulated metrics' rules that judge a paired (shadow) or unpaired (canary) stage
    (`MetricRule.judged_on`, as `rl.promotion.metrics.judge` selects them)."""
    return {k: r for k, r in cfg.metrics.items() if k in ("quality", "tokens", "latency_ms")
            and (r.judged_on == "both" or (r.judged_on == "paired") == paired)}


def _shadow(traffic: Traffic, cfg: PromotionSettings, runs: int) -> tuple[np.ndarray, ...]:
    """The shadow stage: (passed, vetoed, requests) per run; every request mirrored, a look
    every BATCH pairs, undecided at max_n."""
    plan = cfg.stages.shadow
    rules = _stage_rules(cfg, True)
    n_obj = sum(r.objective for r in rules.values())
    rho2 = rho2_for(plan.max_n, cfg.alpha)
    s, c = traffic.draw(runs, plan.max_n)
    cum = {}
    for k in rules:
        d = c[k] - s[k]
        cum[k] = (np.cumsum(c[k], 1), np.cumsum(c[k] ** 2, 1), np.cumsum(s[k], 1),
                  np.cumsum(s[k] ** 2, 1), np.cumsum(d, 1), np.cumsum(d * d, 1))
    decided = np.zeros(runs, dtype=bool)
    passed, vetoed = np.zeros(runs, dtype=bool), np.zeros(runs, dtype=bool)
    requests = np.full(runs, plan.max_n, dtype=np.int64)
    for n in range(BATCH, plan.max_n + 1, BATCH):
        i = n - 1
        judged = {}
        for k, rule in rules.items():
            cs, css, ss, sss, ds, dss = (x[:, i] for x in cum[k])
            judged[k] = verdicts(rule, True, (n, cs, css), (n, ss, sss), (ds, dss), cfg.alpha,
                                 rho2, verdict_floor(plan.min_n), cfg.alpha / n_obj)
        veto, ok = stage_decision(rules, judged, True, plan.min_n)
        new = ~decided & (veto | ok)
        passed |= new & ok & ~veto
        vetoed |= new & veto
        requests[new] = n
        decided |= new
        if decided.all():
            break
    return passed, vetoed, requests


def _canary(traffic: Traffic, cfg: PromotionSettings, stage: str, percent: float,
            runs: int) -> tuple[np.ndarray, ...]:
    """One canary stage on served requests (a live split at `percent`): (passed, vetoed,
    requests served in the stage) per run; a look every CANARY_LOOK candidate requests."""
    plan = getattr(cfg.stages, stage)
    rules = _stage_rules(cfg, False)
    rho2 = rho2_for(plan.max_n, cfg.alpha)
    per_stable = int(round(CANARY_LOOK * (100.0 - percent) / percent))
    sums = {k: np.zeros((4, runs)) for k in rules}
    decided = np.zeros(runs, dtype=bool)
    passed, vetoed = np.zeros(runs, dtype=bool), np.zeros(runs, dtype=bool)
    used = np.zeros(runs, dtype=np.int64)
    n_c = n_s = 0
    while n_c < plan.max_n and not decided.all():
        _, c = traffic.draw(runs, CANARY_LOOK)
        st = traffic.stable_only(runs, per_stable)
        n_c, n_s = n_c + CANARY_LOOK, n_s + per_stable
        judged = {}
        for k, rule in rules.items():
            sums[k] += np.stack([c[k].sum(1), (c[k] ** 2).sum(1), st[k].sum(1),
                                 (st[k] ** 2).sum(1)])
            a = sums[k]
            judged[k] = verdicts(rule, False, (n_c, a[0], a[1]), (n_s, a[2], a[3]), None,
                                 cfg.alpha, rho2, verdict_floor(plan.min_n))
        veto, ok = stage_decision(rules, judged, False, plan.min_n)
        new = ~decided & (veto | ok)
        passed |= new & ok & ~veto
        vetoed |= new & veto
        used[new] = n_c + n_s
        decided |= new
    used[~decided] = n_c + n_s  # inconclusive at max_n
    return passed, vetoed, used


def per_metric(traffic: Traffic, cfg: PromotionSettings, runs: int) -> dict[str, np.ndarray]:
    """The rollout of configs/rl/rollout.yaml judged per metric by `rl.promotion.metrics` (the
    state machine's code): shadow on mirrored pairs, then canary_5 and canary_25 on served
    requests (module doc). Per run: `promoted` (reached full), `vetoed` (a critical metric
    worse, at any stage), `requests` (served until the decision: the veto, else shadow's
    verdict on the objective) and `requests_to_full` (served until full or the end)."""
    passed, vetoed, requests = _shadow(traffic, cfg, runs)
    total = requests.copy()
    alive = passed.copy()
    for stage, percent in CANARY_STAGES:
        ok, veto, used = _canary(traffic, cfg, stage, percent, runs)
        veto_now = alive & veto
        requests = np.where(veto_now, total + used, requests)
        total = np.where(alive, total + used, total)
        vetoed |= veto_now
        alive &= ok
    return {"promoted": alive, "vetoed": vetoed, "requests": requests,
            "requests_to_full": total, "verdict_names": np.asarray(VERDICTS)}


def scalar_unpaired(traffic: Traffic, spec, runs: int, alpha: float = 0.05) -> dict:
    """Today's canary_5 test on one scalar reward, unpaired (module doc)."""
    eff = group_sequential_bounds(SCALAR_LOOKS, alpha, "obrien_fleming", 1).z
    harm = group_sequential_bounds(SCALAR_LOOKS, alpha, "pocock", 1).z
    ratio = (100.0 - CANARY_PERCENT) / CANARY_PERCENT  # stable requests per candidate request
    per_look = SCALAR_MAX_N // SCALAR_LOOKS

    def reward(x: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(spec.per_query(x["quality"], x["quality"], x["latency_ms"],
                                         x["tokens"]), dtype=np.float64)

    sums = np.zeros((4, runs))  # candidate sum, sumsq; stable sum, sumsq
    n_c = n_s = 0
    decided = np.zeros(runs, dtype=bool)
    promoted = np.zeros(runs, dtype=bool)
    requests = np.full(runs, int(SCALAR_MAX_N * (1 + ratio)), dtype=np.int64)
    for k in range(SCALAR_LOOKS):
        _, c = traffic.draw(runs, per_look)
        rc = reward(c)
        ns = int(round(per_look * ratio))
        rs = np.concatenate([reward(traffic.stable_only(runs, min(ns - i, 2000)))
                             for i in range(0, ns, 2000)], axis=1)
        sums += np.stack([rc.sum(1), (rc ** 2).sum(1), rs.sum(1), (rs ** 2).sum(1)])
        n_c, n_s = n_c + per_look, n_s + ns
        mc, ms = sums[0] / n_c, sums[2] / n_s
        vc = (sums[1] - n_c * mc ** 2) / (n_c - 1)
        vs = (sums[3] - n_s * ms ** 2) / (n_s - 1)
        z = (mc - ms) / np.sqrt(vc / n_c + vs / n_s)
        win, lose = z >= eff[k], z <= -harm[k]
        new = ~decided & (win | lose)
        promoted |= new & win
        requests[new] = n_c + n_s
        decided |= new
    return {"promoted": promoted, "requests": requests}


# --------------------------------------------------------------------------- stats


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def median_ci(x: np.ndarray, z: float = 1.959964) -> tuple[float, float, float]:
    """Median with its distribution-free 95% CI (order statistics of a binomial(n, 1/2))."""
    s = np.sort(np.asarray(x, dtype=np.float64))
    n = s.size
    lo = max(0, int(math.floor(n / 2 - z * math.sqrt(n) / 2)))
    hi = min(n - 1, int(math.ceil(n / 2 + z * math.sqrt(n) / 2)))
    return float(np.median(s)), float(s[lo]), float(s[hi])


def row(scenario: str, system: str, metric: str, value: float, lo: float, hi: float,
        n: int) -> dict:
    return {"dataset": scenario, "system": system, "metric": metric, "value": float(value),
            "ci_low": float(lo), "ci_high": float(hi), "n": int(n)}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 rollouts per scenario")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args()
    runs = args.runs or (300 if args.quick else 2000)
    t0 = time.perf_counter()
    cfg = PromotionSettings.from_yaml(DEFAULTS_PATH)
    print("real rows (synthetic world, tuner evaluator):", flush=True)
    rows_ = real_rows()
    from rl.kernel.evaluator import get_evaluator
    from rl.kernel.settings import TunerSettings

    spec = get_evaluator("synthetic", TunerSettings.defaults()).reward_spec()
    rng = np.random.default_rng(SEED)
    out_rows, table, checks = [], [], {}
    medians: dict[tuple[str, str], float] = {}
    for name, sc in SCENARIOS.items():
        kind = sc[3]
        for system in ("per-metric", "scalar-unpaired"):
            t1 = time.perf_counter()
            traffic = Traffic(rows_, sc, rng)
            res = (per_metric(traffic, cfg, runs) if system == "per-metric"
                   else scalar_unpaired(traffic, spec, runs, cfg.alpha))
            k = int(res["promoted"].sum())
            lo, hi = wilson(k, runs)
            metric = "power" if kind == "good" else "wrong_promotion_rate"
            out_rows.append(row(name, system, metric, k / runs, lo, hi, runs))
            m, mlo, mhi = median_ci(res["requests"])
            medians[(name, system)] = m
            out_rows.append(row(name, system, "requests_to_decision_median", m, mlo, mhi, runs))
            if "requests_to_full" in res:
                out_rows.append(row(name, system, "requests_to_full_median",
                                    *median_ci(res["requests_to_full"]), runs))
            ok = (k / runs >= TARGET_POWER) if kind == "good" else (k / runs <= TARGET_WRONG)
            if system == "per-metric":
                checks[f"{name}: {metric} {'>=' if kind == 'good' else '<='} "
                       f"{TARGET_POWER if kind == 'good' else TARGET_WRONG}"] = ok
            extra = (f"vetoed {int(res['vetoed'].sum()) / runs:.3f}; requests to full or "
                     f"rollback, median {np.median(res['requests_to_full']):,.0f}"
                     if "vetoed" in res else "")
            table.append(f"| {name} | {kind} | {system} | {metric} | {k / runs:.4f} "
                         f"[{lo:.4f}, {hi:.4f}] | {m:,.0f} [{mlo:,.0f}, {mhi:,.0f}] | {extra} |")
            print(f"  {name:24s} {system:16s} {metric} {k / runs:.4f}  median requests "
                  f"{m:,.0f}  ({time.perf_counter() - t1:.1f} s)", flush=True)
    for name in SCENARIOS:
        ratio = medians[(name, "per-metric")] / medians[(name, "scalar-unpaired")]
        out_rows.append({"dataset": name, "system": "per-metric / scalar-unpaired",
                         "metric": "requests_to_decision_ratio", "value": ratio,
                         "ci_low": None, "ci_high": None, "n": runs})
        checks[f"{name}: requests_to_decision_median ratio <= {TARGET_RATIO}"] = (
            ratio <= TARGET_RATIO)
    d, o = rows_["default"], rows_["other"]
    noise = {k: float(np.std(o[k] - d[k], ddof=1)) for k in ("quality", "tokens", "latency_ms")}
    # CUPED on the paired differences with the stable arm's own value as the covariate
    # (rl.stats.always_valid.cuped): the share of variance it would remove on these rows, were
    # the stable's mean known from a pre-period (with the mean taken from the same requests the
    # adjusted mean is the plain one: no gain)
    cuped_gain = {k: float(np.corrcoef(o[k] - d[k], d[k])[0, 1] ** 2) for k in noise}
    meta = make_meta(SEED, {}, {"quick": args.quick, "runs": runs, "checks": checks,
                                "rows_source": "rl.kernel.evaluator per-query rows, synthetic "
                                               "world, valid + test (240 questions)",
                                "stable_config": d["hash"], "noise_config": o["hash"],
                                "paired_noise_sd": noise,
                                "cuped_variance_removed": cuped_gain,
                                "stable_means": {k: float(np.mean(d[k])) for k in noise},
                                "per_metric_plan": cfg.stages.shadow.model_dump(),
                                "scalar_plan": {"looks": SCALAR_LOOKS, "max_n": SCALAR_MAX_N,
                                                "canary_percent": CANARY_PERCENT}})
    margin_lines = []
    for name in SCENARIOS:
        for system in ("per-metric", "scalar-unpaired"):
            r = next(x for x in out_rows if x["dataset"] == name and x["system"] == system
                     and x["metric"] in ("power", "wrong_promotion_rate"))
            target = TARGET_POWER if r["metric"] == "power" else TARGET_WRONG
            margin = r["value"] - target if r["metric"] == "power" else target - r["value"]
            margin_lines.append(f"| {name} | {system} | {r['metric']} | {r['value']:.4f} | "
                                f"{'>=' if r['metric'] == 'power' else '<='} {target} | "
                                f"{margin:+.4f} | {'met' if margin >= 0 else 'MISSED'} |")
        ratio = medians[(name, "per-metric")] / medians[(name, "scalar-unpaired")]
        margin_lines.append(f"| {name} | per-metric / scalar-unpaired | "
                            f"requests_to_decision_median ratio | {ratio:.4f} | <= "
                            f"{TARGET_RATIO} | {TARGET_RATIO - ratio:+.4f} | "
                            f"{'met' if ratio <= TARGET_RATIO else 'MISSED'} |")
    body = "\n".join([
        f"{runs:,} simulated rollouts per scenario and system. Per-request noise from real "
        f"rows: the tuner evaluator's per-query rows on the synthetic world (240 questions), "
        f"stable = the static default `{d['hash']}`, paired noise = its centred per-query "
        f"differences from `{o['hash']}` (dense, k = 2) with a random sign: sd quality "
        f"{noise['quality']:.3f}, tokens {noise['tokens']:.1f}, latency "
        f"{noise['latency_ms']:.1f} ms (stable means: quality "
        f"{np.mean(d['quality']):.3f}, tokens {np.mean(d['tokens']):.1f}, latency "
        f"{np.mean(d['latency_ms']):.1f} ms). CUPED on the real paired differences, the "
        "stable's own value as covariate and its mean known from a pre-period, would remove "
        + ", ".join(f"{k} {v:.1%}" for k, v in cuped_gain.items())
        + " of their variance (not used by the judge yet; the random sign of the simulated "
        "noise removes that correlation here).", "",
        "`per-metric`: the rollout of configs/rl/rollout.yaml: shadow (every request "
        f"mirrored; looks every {BATCH} requests; min_n {cfg.stages.shadow.min_n}, max_n "
        f"{cfg.stages.shadow.max_n} pairs), then canary_5 and canary_25 (served requests; "
        f"looks every {CANARY_LOOK} candidate requests; min_n / max_n "
        + ", ".join(f"{getattr(cfg.stages, st).min_n} / {getattr(cfg.stages, st).max_n}"
                    for st, _ in CANARY_STAGES)
        + " candidate requests; a verdict after min(min_n, 30)); rules: "
        + "; ".join(f"{k} {r.direction} margin {r.margin:g}{' rel' if r.relative else ''}"
                    f"{' critical' if r.critical else ''}{' objective' if r.objective else ''}"
                    f" on {r.judged_on}"
                    for k, r in cfg.metrics.items() if k in ("quality", "tokens",
                                                             "latency_ms"))
        + f"; alpha {cfg.alpha}). `scalar-unpaired`: today's canary_5 test "
        f"({SCALAR_LOOKS} looks up to {SCALAR_MAX_N} candidate requests at "
        f"{CANARY_PERCENT:g}%, i.e. up to {int(SCALAR_MAX_N * 100 / CANARY_PERCENT):,} "
        "requests in all).", "",
        "## Targets (fixed before the run) and margins", "",
        "| scenario | system | metric | value | target | margin | |",
        "|---|---|---|---|---|---|---|", *margin_lines, "",
        "## All rows", "",
        "| scenario | kind | system | metric | value [95% CI] | requests to decision, median "
        "[95% CI] | |", "|---|---|---|---|---|---|---|", *table, "",
        "Only the per-metric system's rates are targets; the scalar-unpaired rows show what "
        "today's test does on the same traffic. A harmful or no-gain candidate that is not "
        "promoted is either vetoed (a critical metric shown worse) or ends inconclusive at "
        "max_n. Requests to decision: until a veto, else until shadow's verdict on the "
        "objective (the canaries after it are guardrails: exposure before full); "
        "`requests_to_full_median` counts every request of the rollout. Errors are not "
        f"simulated. Wall time {time.perf_counter() - t0:.0f} s."])
    write_results("promotion", out_rows, meta, "Promotion: per-metric paired vs scalar "
                  "unpaired", body)


if __name__ == "__main__":
    main()
