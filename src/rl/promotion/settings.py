"""Rollout policy (`PromotionSettings`, documented in configs/rl/rollout.yaml): the per-metric
rules and stage sizes the promotion state machine (`rl.promotion.state_machine`) judges with, the
burn-rate bound, and its audit log helpers (JSONL reader, MLflow logging)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from rag.resources import default_config
from rag.settings_base import StrictSettings
from rl.kernel.settings import Thresholds
from rl.promotion.metrics import MetricRule

DEFAULTS_PATH = default_config("rl/rollout.yaml")
AUDIT_FILE = "audit.jsonl"

# --------------------------------------------------------------------------- config


class StagePlan(StrictSettings):
    min_n: int = Field(30, ge=2)
    """Observations (shadow: request pairs; canary: candidate requests) before a pass; a
    verdict (a veto included) needs min(min_n, 30) (`rl.promotion.metrics.verdict_floor`: the
    confidence sequences are asymptotic)."""
    max_n: int = Field(..., ge=10)
    """Observations after which a stage without a pass is inconclusive; the confidence
    sequences are tightest here."""


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
    shadow: StagePlan = StagePlan(min_n=30, max_n=2000)
    canary_5: StagePlan = StagePlan(min_n=500, max_n=1600)
    canary_25: StagePlan = StagePlan(min_n=1000, max_n=2000)


def default_metrics() -> dict[str, MetricRule]:
    """The per-metric rules of configs/rl/rollout.yaml (its comments say why)."""
    return {"quality": MetricRule(direction="higher", margin=0.02, critical=True,
                                  required=True, objective=True, judged_on="paired"),
            "tokens": MetricRule(direction="lower", margin=0.05, relative=True,
                                 objective=True),
            "latency_ms": MetricRule(direction="lower", margin=0.10, relative=True,
                                     critical=True, judged_on="served"),
            "error_rate": MetricRule(direction="lower", margin=0.005, critical=True,
                                     required=True),
            "feedback": MetricRule(direction="higher", margin=0.02, judged_on="served")}


class PromotionSettings(StrictSettings):
    SECTION = "rollout"

    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    """Error of each metric's always-valid confidence sequence per tested stage (over every
    look at once); `better` splits it over the objective metrics."""
    metrics: dict[str, MetricRule] = Field(default_factory=default_metrics)
    """Per-metric rules (`rl.promotion.metrics`), by the metric names evaluators report:
    quality, tokens, latency_ms, error_rate, feedback."""
    quality_scores: list[str] = Field(default_factory=lambda: ["support", "f1"])
    """Gold-based row scores averaged into a logged request's `quality` (those present); a
    request (a mirrored pair: both rows) without them is judged on `sig_combined` instead
    (`rl.promotion.log_evaluators.scored_quality`)."""
    offline_ci: float = Field(0.95, gt=0.0, lt=1.0)
    """Level of the candidate stage's per-metric intervals: the offline report is judged with
    `metrics` as one look at a fixed paired sample (normal CIs, not confidence sequences); a
    DR report (`meta.margin`) needs its own reward CI at least at this level."""
    min_clean_batches: int = Field(3, ge=1)
    on_inconclusive: Literal["rollback", "hold"] = "rollback"
    auto_advance: bool = False
    """Advance inside `observe` as soon as the evidence suffices (the CLI advances explicitly)."""
    shadow_percent: float = Field(100.0, gt=0.0, le=100.0)
    """Share of stable traffic mirrored to the candidate during shadow."""
    stages: Stages = Stages()
    thresholds: Thresholds = Thresholds(faithfulness=0.0, relevancy=0.0)
    """Hard gates per batch; quality gates off (0): promotion judges quality as
    non-inferiority to stable (`metrics.quality`)."""
    slo: SLO = SLO()
    mlflow: bool = False
    mlflow_experiment: str = "rl_rollout"
    mlflow_dir: str = "runs/mlflow"

    @classmethod
    def from_dict(cls, data: Any) -> PromotionSettings:
        """A mapping, bare or as `{rollout: {...}}`; errors name `rollout.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)


# --------------------------------------------------------------------------- helpers


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
