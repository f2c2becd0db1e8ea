"""Rollout policy (`PromotionSettings`, documented in configs/rl/rollout.yaml), the sequential
boundaries and burn-rate bound the promotion state machine (`rl.promotion.state_machine`) uses, and its audit
log helpers (JSONL reader, MLflow logging)."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from rag.resources import default_config
from rag.settings_base import StrictSettings
from rl.kernel.settings import Thresholds
from rl.stats.sequential import SequentialTest

DEFAULTS_PATH = default_config("rl/rollout.yaml")
AUDIT_FILE = "audit.jsonl"

# --------------------------------------------------------------------------- config


class StagePlan(StrictSettings):
    looks: int = Field(5, ge=1, le=20)
    """Planned interim analyses (the last one is final)."""
    max_n: int = Field(..., ge=10)
    """Candidate requests (shadow: request pairs) at the final look."""


class SLO(StrictSettings):
    error_budget: float = Field(0.005, gt=0.0, lt=1.0)
    """Allowed fraction of failed requests (availability SLO 99.5%)."""
    latency_ms: float = Field(500.0, gt=0.0)
    latency_budget: float = Field(0.05, gt=0.0, lt=1.0)
    """Allowed fraction of requests slower than latency_ms (a p95 latency SLO)."""
    max_burn_rate: float = Field(2.0, gt=0.0)
    """Rollback when a burn rate's 95% lower bound exceeds this (fast burn)."""
    advance_max_burn_rate: float = Field(1.0, gt=0.0)
    """Advancing needs observed burn rates at most this (not eating the budget)."""


class Stages(StrictSettings):
    shadow: StagePlan = StagePlan(looks=5, max_n=1500)
    canary_5: StagePlan = StagePlan(looks=5, max_n=1600)
    canary_25: StagePlan = StagePlan(looks=5, max_n=2000)


class PromotionSettings(StrictSettings):
    SECTION = "rollout"

    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    """One-sided type-I error per tested stage (promoting a candidate that is not better)."""
    spending: Literal["obrien_fleming", "pocock"] = "obrien_fleming"
    harm_alpha: float = Field(0.05, gt=0.0, lt=0.5)
    harm_spending: Literal["obrien_fleming", "pocock"] = "pocock"
    offline_ci: float = Field(0.95, gt=0.0, lt=1.0)
    min_clean_batches: int = Field(3, ge=1)
    on_inconclusive: Literal["rollback", "hold"] = "rollback"
    auto_advance: bool = False
    """Advance inside `observe` as soon as the evidence suffices (the CLI advances explicitly)."""
    shadow_percent: float = Field(100.0, gt=0.0, le=100.0)
    """Share of stable traffic mirrored to the candidate during shadow."""
    stages: Stages = Stages()
    thresholds: Thresholds = Thresholds()
    slo: SLO = SLO()
    mlflow: bool = False
    mlflow_experiment: str = "rl_rollout"
    mlflow_dir: str = "runs/mlflow"

    @classmethod
    def from_dict(cls, data: Any) -> PromotionSettings:
        """A mapping, bare or as `{rollout: {...}}`; errors name `rollout.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)


# --------------------------------------------------------------------------- boundaries


@lru_cache(maxsize=64)
def boundaries(looks: int, alpha: float, kind: str) -> tuple[float, ...]:
    """One-sided z boundaries of `looks` equally spaced looks (SequentialTest's plan)."""
    return SequentialTest(looks, alpha=alpha, kind=kind, alternative="greater").plan.z  # type: ignore[arg-type]


def stage_power(config: PromotionSettings, delta: float, sd: float, rho: float = 0.5,
                n_sim: int = 200_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Power of each tested stage's test to detect a per-request reward gain `delta`, with
    per-request reward sd `sd` and, in shadow, correlation `rho` between the two configs'
    rewards for the same request (paired difference sd = sd·sqrt(2(1 − rho))). Canary stages
    are unpaired: `max_n` candidate requests against the stable requests of the same traffic
    split (5% → 19× as many), effective n = 1 / (1/n_c + 1/n_s).

    Per stage: `n` (candidate requests or pairs at the last look), `n_effective`, `fixed` (the
    one-sided z-test at `config.alpha` with all of `n`, `rl.stats.power.power`) and `sequential` (the
    stage's group-sequential test: its `looks` equally spaced looks and efficacy boundaries,
    power by Monte Carlo over `n_sim` seeded Brownian paths, ± ~0.001). A normal
    approximation: the evaluators' t/Welch statistics behave alike at these sample sizes."""
    from rl.stats.power import power

    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float]] = {}
    for name in ("shadow", "canary_5", "canary_25"):
        plan = getattr(config.stages, name)
        if name == "shadow":
            s, n_eff = sd * math.sqrt(2 * (1 - rho)), float(plan.max_n)
        else:
            pct = float(name.split("_")[1])
            s, n_eff = sd, 1.0 / (1.0 / plan.max_n + pct / (plan.max_n * (100.0 - pct)))
        theta = delta / s * math.sqrt(n_eff)  # mean of the final look's z
        t = np.arange(1, plan.looks + 1) / plan.looks
        b = np.asarray(boundaries(plan.looks, config.alpha, config.spending))
        walk = np.cumsum(rng.standard_normal((n_sim, plan.looks)), axis=1) / math.sqrt(
            plan.looks)
        z = (walk + theta * t) / np.sqrt(t)
        out[name] = {"n": float(plan.max_n), "n_effective": n_eff,
                     "fixed": power(max(1, int(n_eff)), delta, s, config.alpha, sided=1),
                     "sequential": float(np.mean(np.any(z >= b, axis=1)))}
    return out


def wilson_lower(k: int, n: int, z: float = 1.6448536) -> float:
    """One-sided Wilson lower bound of a binomial proportion k/n."""
    if n <= 0:
        return 0.0
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if hasattr(x, "item"):
        return _jsonable(x.item())
    return x


def read_audit(state_dir: str | Path) -> list[dict[str, Any]]:
    """Every audit record of `state_dir`, oldest first."""
    p = Path(state_dir) / AUDIT_FILE
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _log_mlflow(config: PromotionSettings, rec: dict[str, Any]) -> None:
    import mlflow

    from rl.common.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(config.mlflow_dir))
    mlflow.set_experiment(config.mlflow_experiment)
    with mlflow.start_run(run_name=f"{rec['rollout_id']}-{rec['from']}-to-{rec['to']}"):
        mlflow.set_tags({k: str(rec[k]) for k in ("rollout_id", "action", "from", "to",
                                                  "config_hash", "stable_hash",
                                                  "dataset_manifest_id", "code_commit")})
        mlflow.log_params({"reason": rec["reason"][:250]})
        nums = {k: float(v) for k, v in rec["evidence"].items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if nums:
            mlflow.log_metrics(nums)
        mlflow.log_text(json.dumps(rec, indent=2, sort_keys=True), "transition.json")
