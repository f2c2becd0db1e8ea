"""Evidence-gated promotion: candidate → shadow → canary_5 → canary_25 → full, or rolled_back.

    sm = PromotionStateMachine.start("runs/rollout", candidate="3f2a…", stable="9c1d…",
                                     manifest_id="hotpotqa@1a2b3c4d5e6f")
    sm.observe(report)   # an EvaluationReport (rl.promotion.evaluators): offline, shadow or canary batch
    sm.advance()         # one stage up when the evidence suffices, else refuses and says why
    sm.rollback("reason"); PromotionStateMachine.load("runs/rollout")  # state.json survives

Evidence, per stage (the stage's reports must be of the stage's kind):
  candidate  one offline report (replay or the tuner's tables: paired by question), judged
             per metric with the rules below, as one look at a fixed sample: each metric's
             paired difference has a normal interval at level `offline_ci` (not a confidence
             sequence), and at least MIN_VERDICT_N pairs. It passes when every required metric
             (quality, errors) is non-inferior and an objective metric (quality or tokens) is
             better; a critical metric worse than its margin rolls back. A later offline
             report replaces the earlier one. The one exception is a report without per-metric
             statistics that carries `meta.margin` m: a new per-query policy's DR estimate
             of one reward from the interaction log (`log_evaluators.policy_from_log`), which
             passes when its reward CI lower bound is >= −m (> 0 when m = 0), i.e. the
             candidate's DR lower bound is at least the stable value minus m, and rolls back
             when its upper bound is < −m. An offline report with neither is a ConfigError.
  shadow     paired shadow batches (mirrored requests: both arms answered the same question);
  canary_5 / canary_25: unpaired canary batches (a live split).
             Judged per metric (`rl.promotion.metrics`; the rules are `metrics` in
             configs/rl/rollout.yaml): each metric's candidate − stable difference has an
             always-valid confidence sequence (`rl.stats.always_valid`), so the evidence is
             read after every batch without inflating the error rate. The stage passes once
             `min_n` observations are in, no metric is worse than its margin or still pending,
             and an objective metric (quality or tokens by default) is significantly better.
             A critical metric (quality, latency, errors) significantly worse than its margin
             rolls back at once; `max_n` observations without a pass is inconclusive: rollback
             (or hold, `on_inconclusive`).
  every stage after candidate also needs `min_clean_batches` consecutive batches without a
             hard-gate violation, and error-budget burn rates at most `advance_max_burn_rate`.
Automatic rollback, at every stage before `full` (the state machine would judge evidence at
`full` too, but `ragpilot rollout advance` and the admin API refuse it there: at full, rollback
is the operator's `ragpilot rollout rollback`, runbooks/canary_promotion.md): a batch with a
hard-gate violation; a
critical metric worse than its margin (offline too; a DR report: its CI below −margin); a fast
error-budget
burn: the one-sided 95% Wilson lower bound of the stage's candidate error rate (or of its
fraction of requests slower than `slo.latency_ms`) exceeds `slo.max_burn_rate` × the budget.

Every transition is appended to `audit.jsonl` (time, from, to, reason, config hashes, dataset
manifest id, code commit, evidence numbers); with `mlflow: true` also an MLflow run. Config
and audit helpers: `rl.promotion.settings`."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.jsonrec import check_fields
from rl.promotion.evaluators import EvaluationReport
from rl.promotion.metrics import MIN_VERDICT_N, Judgement, MetricStats, judge
from rl.promotion.settings import (  # noqa: F401
    AUDIT_FILE,
    DEFAULTS_PATH,
    SLO,
    PromotionSettings,
    _jsonable,
    _log_mlflow,
    read_audit,
    wilson_lower,
)

STAGES = ("candidate", "shadow", "canary_5", "canary_25", "full")
ROLLED_BACK = "rolled_back"
TESTED = ("shadow", "canary_5", "canary_25")
KIND = {"candidate": "offline", "shadow": "shadow", "canary_5": "canary", "canary_25": "canary"}
CANARY_PERCENT = {"candidate": 0.0, "shadow": 0.0, "canary_5": 5.0, "canary_25": 25.0,
                  "full": 100.0, ROLLED_BACK: 0.0}
STATE_FILE = "state.json"


# --------------------------------------------------------------------------- records


@dataclass
class Decision:
    """What `observe` / `advance` / `rollback` did: action advance | rollback | hold | ready |
    refused, the stage before and after, why, and the evidence numbers it rests on."""

    action: str
    from_stage: str
    to_stage: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fresh_evidence() -> dict[str, Any]:
    return {"batches": 0, "clean_streak": 0, "n": 0, "errors": 0, "err_n": 0, "slow": 0,
            "lat_n": 0, "metrics": {}, "judgements": [], "decision": None, "why": "",
            "efficacy": False, "offline": None, "quality_on": {}}


@dataclass
class RolloutState:
    rollout_id: str
    candidate: str
    stable: str
    manifest_id: str
    code_commit: str
    stage: str = "candidate"
    started: float = field(default_factory=time.time)
    evidence: dict[str, Any] = field(default_factory=_fresh_evidence)
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    row_cursor: float = 0.0
    """Unix time of the newest interaction row already counted (log adapters skip older rows,
    so a cumulative export is never counted twice); reset to the transition time on every
    transition, so a stage never sees the previous stage's traffic."""
    counted: list[str] = field(default_factory=list)
    """Fingerprints of the evaluation reports already observed (`rl.promotion.evidence`):
    the same report submitted again is not counted twice."""


_STATE_FIELDS = {"rollout_id": str, "candidate": str, "stable": str, "manifest_id": str,
                 "code_commit": str, "stage": str, "started": (int, float), "evidence": dict,
                 "history": list, "config": dict, "row_cursor": (int, float),
                 "counted": list}


def _state_from_dict(data: Any) -> RolloutState:
    """A state file's content as a RolloutState; ValueError naming the field in words (not a
    dataclass signature) when it is not one this version wrote."""
    check_fields(data, _STATE_FIELDS, ("rollout_id", "candidate", "stable", "manifest_id",
                                       "code_commit"))
    if data.get("stage", "candidate") not in (*STAGES, ROLLED_BACK):
        raise ValueError(f"stage {data['stage']!r} is not one of {', '.join(STAGES)}, "
                         f"{ROLLED_BACK}")
    return RolloutState(**data)


def quality_source_text(quality_on: dict[str, int]) -> str:
    """What a stage's quality was judged on, for people: e.g. "judged on sig_combined (80),
    gold (0); 3 without a quality score (excluded)" ('' when nothing was counted).
    `quality_on`: the stage's {source: count} (`rl.promotion.log_evaluators.QUALITY_SOURCES`;
    pairs in shadow, requests in a canary)."""
    if not any(quality_on.values()):
        return ""
    used = sorted(((k, v) for k, v in quality_on.items() if k != "none"),
                  key=lambda kv: -kv[1])
    return ("judged on " + ", ".join(f"{k} ({v})" for k, v in used)
            + f"; {quality_on.get('none', 0)} without a quality score (excluded)")


def _is_dr(report: EvaluationReport) -> bool:
    """Whether an offline report is a per-query policy's DR estimate judged on its reward CI
    and margin (`log_evaluators.policy_from_log`: `meta.margin`, no per-metric statistics)."""
    return not report.metrics and "margin" in report.meta


def offline_judgement(config: PromotionSettings, stats: dict[str, MetricStats], n: int
                      ) -> tuple[list[Judgement], str, str]:
    """The candidate stage's judgement of an offline report: `stats` (metric -> its paired
    MetricStats over `n` pairs) judged by `config.metrics` as one look at a fixed sample
    (normal intervals at `config.offline_ci`, at least MIN_VERDICT_N pairs). Returns the
    per-metric judgements, the decision (`pass` | `veto` | `continue`) and why."""
    return judge(config.metrics, {k: v for k, v in stats.items() if k in config.metrics},
                 1.0 - config.offline_ci, max(int(n), 1), MIN_VERDICT_N, sequential=False)


# --------------------------------------------------------------------------- the machine


class PromotionStateMachine:
    """See the module doc. `state_dir=None` keeps everything in memory (simulations); the audit
    records are then only in `self.audit`."""

    def __init__(self, state: RolloutState, config: PromotionSettings,
                 state_dir: str | Path | None = None):
        self.state, self.config = state, config
        self.dir = Path(state_dir) if state_dir is not None else None
        self.audit: list[dict[str, Any]] = []

    @classmethod
    def start(cls, state_dir: str | Path | None, candidate: str, stable: str,
              manifest_id: str = "unknown", config: PromotionSettings | None = None,
              code_commit: str | None = None, force: bool = False) -> PromotionStateMachine:
        """A new rollout at stage `candidate`. Refuses to replace an active one unless
        `force` (a finished or rolled-back rollout is replaced; the audit log keeps growing)."""
        for name, v in (("candidate", candidate), ("stable", stable)):
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(name, "must be a non-empty config hash")
        if candidate == stable:
            raise ConfigError("candidate", "is the stable config; nothing to roll out")
        config = config or PromotionSettings()
        if state_dir is not None and (Path(state_dir) / STATE_FILE).exists() and not force:
            old = cls.load(state_dir)
            if old.state.stage not in ("full", ROLLED_BACK):
                raise ConfigError("state", f"rollout {old.state.rollout_id} is active at stage "
                                           f"{old.state.stage}; roll it back or pass --force")
        if code_commit is None:
            from rl.common.tracking import code_commit as _commit

            code_commit = _commit()
        st = RolloutState(uuid.uuid4().hex[:12], candidate, stable, manifest_id, code_commit,
                          config=config.model_dump(mode="json"))
        sm = cls(st, config, state_dir)
        sm._record("start", "none", "candidate", "rollout started", {})
        return sm

    @classmethod
    def load(cls, state_dir: str | Path) -> PromotionStateMachine:
        p = Path(state_dir) / STATE_FILE
        if not p.exists():
            raise ConfigError("state", f"no rollout state in {state_dir} (run `ragpilot rollout "
                                       "start` first)")
        try:
            st = _state_from_dict(json.loads(p.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError("state", f"{p} is not a rollout state file: {exc}") from None
        return cls(st, PromotionSettings.from_dict(st.config), state_dir)

    def save(self) -> None:
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(asdict(self.state), indent=1, default=float))
        os.replace(tmp, self.dir / STATE_FILE)

    @property
    def stage(self) -> str:
        return self.state.stage

    @property
    def done(self) -> bool:
        return self.stage in ("full", ROLLED_BACK)

    def traffic(self) -> dict[str, float]:
        """Traffic split for the current stage (`serving.traffic.TrafficSplitter.set_traffic`
        keys)."""
        return {"canary_percent": CANARY_PERCENT[self.stage],
                "shadow_percent": self.config.shadow_percent if self.stage == "shadow" else 0.0}

    # ---- evidence -------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Evidence of the current stage: n, per-metric judgements (verdict, difference, its
        confidence sequence, margin), the stage decision, burn rates."""
        e, c = self.state.evidence, self.config
        out: dict[str, Any] = {"stage": self.stage, "batches": e["batches"],
                               "clean_streak": e["clean_streak"], "n": e["n"]}
        if self.stage == "candidate":
            out.update({"offline": e["offline"], "decision": e["decision"], "why": e["why"],
                        "metrics": e["judgements"]})
        elif self.stage in TESTED:
            plan = getattr(c.stages, self.stage)
            out.update({"min_n": plan.min_n, "max_n": plan.max_n, "efficacy": e["efficacy"],
                        "decision": e["decision"], "why": e["why"],
                        "metrics": e["judgements"],
                        "quality_on": dict(e.get("quality_on") or {})})
        out.update(self._burn())
        return out

    def _burn(self) -> dict[str, float | None]:
        e, slo = self.state.evidence, self.config.slo
        out: dict[str, float | None] = {"error_burn": None, "error_burn_low": None,
                                        "latency_burn": None, "latency_burn_low": None}
        if e["err_n"]:
            out["error_burn"] = e["errors"] / e["err_n"] / slo.error_budget
            out["error_burn_low"] = wilson_lower(e["errors"], e["err_n"]) / slo.error_budget
        if e["lat_n"]:
            out["latency_burn"] = e["slow"] / e["lat_n"] / slo.latency_budget
            out["latency_burn_low"] = wilson_lower(e["slow"], e["lat_n"]) / slo.latency_budget
        return out

    def _accumulate(self, r: EvaluationReport) -> None:
        e = self.state.evidence
        e["batches"] += 1
        e["clean_streak"] = e["clean_streak"] + 1 if r.gates_passed else 0
        c = r.candidate
        if c.errors is not None:
            e["errors"] += c.errors
            e["err_n"] += c.n
        if c.slow is not None:
            e["slow"] += c.slow
            e["lat_n"] += c.n
        if self.stage == "candidate":  # the latest offline report replaces the earlier one
            e["n"] = c.n
            e["offline"] = {"diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high,
                            "ci": r.ci, "n": c.n, "method": r.ci_method,
                            "dr": _is_dr(r), "margin": float(r.meta.get("margin") or 0.0)}
            e["metrics"] = {k: MetricStats.from_dict(d, f"report.metrics.{k}").to_dict()
                            for k, d in r.metrics.items() if k in self.config.metrics}
            e["judgements"], e["decision"], e["why"], e["efficacy"] = [], None, "", False
            return
        e["n"] += c.n
        on = e.setdefault("quality_on", {})
        for source, k in (r.meta.get("quality_on") or {}).items():
            on[source] = on.get(source, 0) + int(k)
        for name, d in r.metrics.items():
            if name not in self.config.metrics:
                continue
            got = MetricStats.from_dict(d, f"report.metrics.{name}")
            old = e["metrics"].get(name)
            e["metrics"][name] = (got if old is None else
                                  MetricStats.from_dict(old) + got).to_dict()

    def check_kind(self, report: EvaluationReport, field: str = "report.kind") -> None:
        """ConfigError `field` unless the current stage takes reports of `report.kind`; at
        stage candidate also ConfigError `<report>.metrics` for an offline report that
        carries no per-metric statistics of the rollout's metrics and is no DR estimate
        (`meta.margin`): nothing in it could be judged."""
        expected = KIND.get(self.stage)
        if expected is not None and report.kind != expected:
            raise ConfigError(field, f"stage {self.stage} takes {expected} reports, got "
                                     f"{report.kind}")
        if (self.stage == "candidate" and not _is_dr(report)
                and not set(report.metrics) & set(self.config.metrics)):
            raise ConfigError(field.rsplit(".", 1)[0] + ".metrics",
                              "the offline report has no per-metric paired statistics ("
                              f"{', '.join(self.config.metrics)}): the candidate stage judges "
                              "each metric; `ragpilot rollout replay` writes such a report")

    def observe(self, report: EvaluationReport) -> Decision:
        """Add one batch report to the current stage's evidence; take a planned look when one
        is due; roll back automatically on a breach. With `auto_advance`, also advance."""
        if self.stage == ROLLED_BACK:
            raise ConfigError("state", "the rollout was rolled back; start a new one")
        self.check_kind(report)
        self._accumulate(report)
        ev = {"batch_n": report.n, "batch_diff": report.diff, "gates": report.gates}
        if not report.gates_passed:
            return self.rollback(f"hard gate breach: {', '.join(report.failed_gates)}", ev)
        burn, slo = self._burn(), self.config.slo
        for key in ("error_burn_low", "latency_burn_low"):
            if burn[key] is not None and burn[key] > slo.max_burn_rate:
                what = key.split("_")[0]
                return self.rollback(f"{what} budget burning at >= {burn[key]:.2f}x "
                                     f"(limit {slo.max_burn_rate}x)", {**ev, **burn})
        if self.stage == "candidate":
            off = self.state.evidence["offline"]
            if off["dr"] and off["ci_high"] < -off["margin"]:
                return self.rollback("offline DR reward estimate significantly worse (CI below "
                                     f"{-off['margin']:g})", off)
            if not off["dr"]:
                d = self._judge_offline()
                if d is not None:
                    return d
        elif self.stage in TESTED and not self.state.evidence["efficacy"]:
            d = self._judge()
            if d is not None:
                return d
        if self.stage == "full":
            self.save()
            return Decision("hold", "full", "full", "monitoring at full traffic", ev)
        ok, why = self.ready()
        if ok and self.config.auto_advance:
            return self.advance()
        self.save()
        return Decision("ready" if ok else "hold", self.stage, self.stage, why, self.summary())

    def _judge(self) -> Decision | None:
        """Judge the tested stage's metrics (`rl.promotion.metrics.judge`); record the
        verdicts. A critical metric worse than its margin rolls back; a pass marks the stage
        efficacious; `max_n` observations without a pass is inconclusive (rollback or hold)."""
        e, c = self.state.evidence, self.config
        plan = getattr(c.stages, self.stage)
        judged, decision, why = judge(c.metrics, self._stats(), c.alpha, plan.max_n, plan.min_n)
        e["judgements"] = [j.to_dict() for j in judged]
        said = quality_source_text(e.get("quality_on") or {})
        for j in e["judgements"]:
            if j["metric"] == "quality" and said:
                j["statistic"] += f"; {said}"
        e["decision"], e["why"] = decision, why
        if decision == "veto":
            return self.rollback(why, self.summary())
        if decision == "pass":
            e["efficacy"] = True
            return None
        if e["n"] >= plan.max_n:
            if c.on_inconclusive == "rollback":
                return self.rollback(f"inconclusive after {e['n']} observations (max_n "
                                     f"{plan.max_n}): {why}", self.summary())
            e["efficacy"] = None  # hold: spent, waiting for an operator
        return None

    def _judge_offline(self) -> Decision | None:
        """Judge the candidate stage's offline report per metric: one look at a fixed paired
        sample (normal intervals at `offline_ci`, at least MIN_VERDICT_N pairs), the same
        rules and margins as shadow. A critical metric worse than its margin rolls back; a
        pass marks the stage efficacious."""
        e = self.state.evidence
        judged, decision, why = offline_judgement(self.config, self._stats(), e["n"])
        e["judgements"] = [j.to_dict() for j in judged]
        e["decision"], e["why"] = decision, why
        if decision == "veto":
            return self.rollback(f"offline report: {why}", self.summary())
        e["efficacy"] = decision == "pass"
        return None

    def _stats(self) -> dict[str, MetricStats]:
        return {k: MetricStats.from_dict(v, f"evidence.metrics.{k}")
                for k, v in self.state.evidence["metrics"].items()}

    def ready(self) -> tuple[bool, str]:
        """Whether the current stage's evidence suffices to advance, and what is missing."""
        e, c = self.state.evidence, self.config
        if self.done:
            return False, f"rollout is {self.stage}"
        missing = []
        if self.stage == "candidate":
            off = e["offline"]
            if off is None:
                return False, "needs an offline report (ragpilot rollout advance --evidence)"
            if not off.get("dr"):
                return (True, f"offline report: {e['why']}") if e["efficacy"] else (
                    False, "needs (offline report): " + e["why"].removeprefix("needs: "))
            if off["ci"] < c.offline_ci - 1e-9:
                missing.append(f"an offline CI at level >= {c.offline_ci} (got {off['ci']})")
            m = off["margin"]
            if not (off["ci_low"] >= -m if m > 0 else off["ci_low"] > 0):
                missing.append(f"offline DR {off['ci']:.0%} CI lower bound "
                               f"{off['ci_low']:.4f} "
                               + (f">= -{m:g} (margin)" if m > 0 else "above 0"))
            return not missing, ("needs: " + "; ".join(missing) if missing else
                                 f"offline DR CI lower bound >= -{m:g}" if m > 0 else
                                 "offline DR CI > 0")
        if e["efficacy"] is None:
            missing.append("sequential test ended inconclusive (hold): roll back or restart")
        elif not e["efficacy"]:
            plan = getattr(c.stages, self.stage)
            missing.append(e["why"].removeprefix("needs: ") if e["why"] else
                           f"per-metric evidence ({e['n']} of at least {plan.min_n} "
                           "observations)")
        if e["clean_streak"] < c.min_clean_batches:
            missing.append(f"{c.min_clean_batches} consecutive gate-clean batches "
                           f"(have {e['clean_streak']})")
        burn = self._burn()
        for key in ("error_burn", "latency_burn"):
            if burn[key] is not None and burn[key] > c.slo.advance_max_burn_rate:
                missing.append(f"{key} {burn[key]:.2f} > {c.slo.advance_max_burn_rate}")
        if not missing:
            return True, e["why"] or "evidence suffices"
        return False, "needs: " + "; ".join(missing)

    def advance(self) -> Decision:
        """Move one stage up when `ready()`; otherwise refuse (state unchanged)."""
        if self.stage == ROLLED_BACK:
            return Decision("refused", self.stage, self.stage, "the rollout was rolled back")
        ok, why = self.ready()
        if not ok:
            return Decision("refused", self.stage, self.stage, why, self.summary())
        frm, to = self.stage, STAGES[STAGES.index(self.stage) + 1]
        ev = self.summary()
        self._record("advance", frm, to, why, ev)
        return Decision("advance", frm, to, why, ev)

    def rollback(self, reason: str, evidence: dict[str, Any] | None = None) -> Decision:
        if self.stage == ROLLED_BACK:
            return Decision("refused", ROLLED_BACK, ROLLED_BACK, "already rolled back")
        if not reason or not reason.strip():
            raise ConfigError("reason", "a rollback needs a reason")
        frm, ev = self.stage, {**self.summary(), **(evidence or {})}
        self._record("rollback", frm, ROLLED_BACK, reason, ev)
        return Decision("rollback", frm, ROLLED_BACK, reason, ev)

    def _record(self, action: str, frm: str, to: str, reason: str, evidence: dict) -> None:
        st = self.state
        rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ts": time.time(),
               "rollout_id": st.rollout_id, "action": action, "from": frm, "to": to,
               "reason": reason, "config_hash": st.candidate, "stable_hash": st.stable,
               "dataset_manifest_id": st.manifest_id, "code_commit": st.code_commit,
               "traffic_canary_percent": CANARY_PERCENT[to],
               "evidence": _jsonable(evidence)}
        st.stage, st.row_cursor = to, rec["ts"]
        st.evidence = _fresh_evidence()
        st.history.append({k: rec[k] for k in ("time", "action", "from", "to", "reason")})
        self.audit.append(rec)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            with (self.dir / AUDIT_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        self.save()
        if self.config.mlflow:
            _log_mlflow(self.config, rec)
