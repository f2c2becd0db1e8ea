"""The rollout operations `ragpilot rollout ...` and the Serve app's `/admin/rollout*` endpoints
share: status, start, advance with evidence, rollback, the router split of a stage, and the
replay report (offline evidence from the interaction log).

State lives in a state directory (`DEFAULT_DIR` = runs/rollout): `state.json` (resumable) and
`audit.jsonl` (append-only, one line per transition; rl.promotion.state_machine).

Every function returns records (dicts, Decisions, EvaluationReports) and raises typed errors:
ConfigError naming a field in the library's words (`candidate`, `stable`, `manifest`,
`reason`, `evidence`, `pii_penalty`, `index`, `relevancy`, `limit`, `rows`, `state`; the CLI
maps them to its flags) and `RolloutClosed` when a finished rollout is asked to move. Nothing
here prints or reads command-line arguments.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.errors import ConfigError, RagError

if TYPE_CHECKING:
    from rl.kernel.settings import TunerSettings

DEFAULT_DIR = "runs/rollout"
ID_CHARS = r"[A-Za-z0-9_.:@-]"
"""What a config hash, variant id or manifest id may hold (they go into the rollout's state and
audit log; the Serve API's rollout bodies use the same class)."""
_ID = re.compile(rf"^{ID_CHARS}{{1,64}}$")

LeakCounter = Callable[..., float]
"""`(answer, question, contexts) -> number of PII leaks` (the CLI passes serving.pii's)."""


class RolloutClosed(RagError):
    """The rollout is `full` or `rolled_back`: it takes no evidence and no advance (the CLI
    exits 1, the API answers 409). `stage` is where it ended."""

    def __init__(self, stage: str):
        self.stage = stage
        super().__init__(f"rollout is {stage}; start a new one")


# --------------------------------------------------------------------------- identifiers


def config_id(value: str, field: str = "candidate") -> str:
    """A RAG config YAML/JSON path -> its config hash; otherwise `value` must be a config hash
    or variant id (letters, digits, `_.:@-`, at most 64)."""
    p = Path(value)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        from rag.config import RAGConfig

        if not p.exists():
            raise ConfigError(field, f"file {p} does not exist")
        return RAGConfig.from_yaml(p).config_hash
    if not _ID.match(value):
        raise ConfigError(field, f"must be a config hash / variant id or a config YAML, got "
                                 f"{value!r}")
    return value


def manifest_id(value: str | None) -> str:
    """A dataset split manifest file -> `<stem>@<sha256[:12]>`; an id is kept; none ->
    `unknown`."""
    if not value:
        return "unknown"
    p = Path(value)
    if p.exists():
        return f"{p.stem}@{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}"
    if p.suffix in (".json", ".yaml", ".yml") or "/" in value:
        # meant as a file: a mistyped path must not become the rollout's manifest id
        raise ConfigError("manifest", f"file {value} does not exist")
    if not _ID.match(value):
        raise ConfigError("manifest", f"must be a manifest file or an id, got {value!r}")
    return value


# --------------------------------------------------------------------------- traffic


def router_settings(sm: Any) -> dict[str, Any]:
    """The traffic split at the rollout's stage (`serving.traffic.TrafficSplitter.set_traffic`
    arguments): mode, canary_percent, shadow_percent, canary, shadow, stable. At `full` the candidate *is* the
    stable (its 100% share), so no canary share is left."""
    t = sm.traffic()
    stage = sm.stage
    return {"mode": "split", "canary_percent": 0.0 if stage == "full" else t["canary_percent"],
            "shadow_percent": t["shadow_percent"],
            "canary": sm.state.candidate if stage in ("canary_5", "canary_25") else None,
            "shadow": sm.state.candidate if stage == "shadow" else None,
            "stable": sm.state.candidate if stage == "full" else sm.state.stable}


def traffic_body(sm: Any) -> dict[str, Any]:
    """The `POST /admin/traffic` body that applies the stage's split (stable included: after a
    rollback, from `full` too, it names the rollout's old stable)."""
    t = router_settings(sm)
    return {"mode": "split", "canary_percent": t["canary_percent"],
            "shadow_percent": t["shadow_percent"], "canary_config": t["canary"],
            "shadow_config": t["shadow"], "stable": t["stable"]}


# --------------------------------------------------------------------------- operations


def load(state_dir: str | Path) -> Any:
    """The rollout in `state_dir` (ConfigError `state` when there is none)."""
    from rl.promotion.state_machine import PromotionStateMachine

    return PromotionStateMachine.load(state_dir)


def active(state_dir: str | Path) -> Any:
    """The rollout in `state_dir` when one is active (not full / rolled back), else None."""
    from rl.promotion.state_machine import STATE_FILE

    if not (Path(state_dir) / STATE_FILE).exists():
        return None
    sm = load(state_dir)
    return None if sm.done else sm


def status(state_dir: str | Path) -> dict[str, Any]:
    """The rollout as a record: ids, stage, traffic (`router_settings`), ready + why,
    evidence summary, history and the audit log's path."""
    sm = load(state_dir)
    ok, why = sm.ready()
    return {"rollout_id": sm.state.rollout_id, "stage": sm.stage,
            "candidate": sm.state.candidate, "stable": sm.state.stable,
            "dataset_manifest_id": sm.state.manifest_id, "code_commit": sm.state.code_commit,
            "traffic": router_settings(sm), "ready": ok, "why": why,
            "evidence": sm.summary(), "history": sm.state.history,
            "audit_log": str(Path(state_dir) / "audit.jsonl")}


def settings(path: str | Path | None = None, mlflow: bool = False) -> Any:
    """PromotionSettings from `path` (default configs/rl/rollout.yaml); `mlflow` also logs
    transitions to MLflow."""
    from rl.promotion.state_machine import DEFAULTS_PATH, PromotionSettings

    cfg = PromotionSettings.from_yaml(path or DEFAULTS_PATH)
    return cfg.model_copy(update={"mlflow": True}) if mlflow else cfg


def start(state_dir: str | Path, candidate: str, stable: str, manifest: str = "unknown",
          config: Any = None, force: bool = False) -> Any:
    """A new rollout of `candidate` (a config hash) against `stable` at stage `candidate`,
    under `config` (PromotionSettings, default `settings()`); refuses to replace an active
    rollout unless `force`. Returns the PromotionStateMachine."""
    from rl.promotion.state_machine import PromotionStateMachine

    return PromotionStateMachine.start(state_dir, candidate, stable, manifest,
                                       config if config is not None else settings(),
                                       force=force)


def advance(sm: Any, reports: Sequence[Any]) -> Any:
    """Observe `reports` in order, stopping at the first that rolls the rollout back or
    advances it (auto_advance); when none did, try one stage up (`sm.advance()`). A report
    already counted in this rollout (same `evidence.report_fingerprint`, kept in
    `state.counted`) is skipped: the same report submitted again adds nothing. Returns the
    last Decision; its `action` is advance, rollback or hold. Raises RolloutClosed at
    full/rolled_back."""
    if sm.done:
        raise RolloutClosed(sm.stage)
    from rl.promotion.evidence import report_fingerprint

    for i, rep in enumerate(reports):  # all checked first: a refused call observes nothing
        sm.check_kind(rep, f"reports.{i}.kind")
    for rep in reports:
        fp = report_fingerprint(rep.to_dict())
        if fp in sm.state.counted:  # the same report again: evidence counts once
            continue
        sm.state.counted.append(fp)  # saved by observe
        d = sm.observe(rep)
        if d.action in ("rollback", "advance"):
            return d
    return sm.advance()


def check_reason(reason: str | None) -> str:
    """`reason` when it says something (a rollback needs one), else ConfigError `reason`."""
    if not reason or not reason.strip():
        raise ConfigError("reason", "a rollback needs a reason")
    return reason


def rollback(sm: Any, reason: str) -> Any:
    """Roll the rollout back now for `reason` (recorded in the audit log); the Decision."""
    return sm.rollback(check_reason(reason))


def decision_record(d: Any) -> dict[str, Any]:
    """A Decision as the API returns it: action, from, to, reason."""
    return {"action": d.action, "from": d.from_stage, "to": d.to_stage, "reason": d.reason}


# --------------------------------------------------------------------------- replay


def rollout_settings(state_dir: str | Path = DEFAULT_DIR, config: str | Path | None = None
                     ) -> Any:
    """The PromotionSettings a replay is judged by: `config` (a rollout YAML) when given, else
    the active rollout's in `state_dir`, else the defaults (`settings()`)."""
    if config:
        return settings(config)
    sm = active(state_dir)
    return sm.config if sm is not None else settings()


def replay_report(log: str | Path, candidate: str | Path, state_dir: str | Path = DEFAULT_DIR,
                  *, stable: str | None = None, index: str | Path | None = None,
                  dataset: str | None = None, relevancy: str = "answer_relevancy",
                  limit: int | None = None, config: str | Path | None = None,
                  tuner_settings: TunerSettings | None = None,
                  pii_penalty: float | None = None,
                  leak_counter: LeakCounter | None = None) -> Any:
    """Offline evidence: the logged, served questions of `stable` re-asked of the `candidate`
    config over the served index (`rl.promotion.replay.ReplayEvaluator`) -> EvaluationReport.

    `candidate`: the candidate's RAG config YAML. `stable` (hash or YAML), the gates and SLO
    (`config`) default to the active rollout's in `state_dir`; a candidate or stable that is
    not that rollout's (at stage candidate) is refused. `index`: the served index directory;
    `dataset`: the served dataset (its indexes without `index`, and gold answers; with `index`,
    the directory must hold that dataset's corpus: CorpusMismatchError otherwise).
    `pii_penalty`: reward lost per leak (default PII_LEAK_WEIGHT; 0 off), leaks counted by
    `leak_counter` (none: the term is 0). `tuner_settings`: the reward weights (default
    `TunerSettings.defaults()`)."""
    from rag.config import RAGConfig
    from rag.corpus.hygiene import gold_by_question
    from rl.kernel.reward import PII_LEAK_WEIGHT
    from rl.kernel.settings import TunerSettings
    from rl.promotion.replay import ReplayEvaluator, read_log

    sm = active(state_dir)
    cand_path = Path(candidate)
    if not cand_path.is_file():
        raise ConfigError("candidate", f"replay needs the candidate's RAG config YAML; "
                                       f"{str(candidate)!r} is not a file")
    cand = RAGConfig.from_yaml(cand_path)
    if stable:
        stable = config_id(stable, "stable")
    elif sm is not None:
        stable = sm.state.stable
    else:
        raise ConfigError("stable", f"required: no active rollout in {state_dir} to take the "
                                    "stable config hash from")
    if sm is not None and sm.stage == "candidate":
        for name, got, want in (("candidate", cand.config_hash, sm.state.candidate),
                                ("stable", stable, sm.state.stable)):
            if got != want:
                raise ConfigError(name, f"config hash {got} is not the {name} {want} of the "
                                        f"rollout in {state_dir} (another state dir replays "
                                        "outside it)")
    cfg = rollout_settings(state_dir, config)
    tuner = tuner_settings or TunerSettings.defaults()
    if not index and not dataset:
        raise ConfigError("index", "give the served index directory (--index DIR) or the "
                                   "served dataset (--dataset NAME)")
    gold: dict[str, Any] = {}
    if index:
        from rag.indexset import IndexSet

        indexes = IndexSet.open(index)
        if dataset:
            from rag.corpus.loaders import load_dataset

            ds = load_dataset(dataset)
            indexes.check_corpus(ds.corpus, dataset)  # its gold would match no context
            examples = ds.examples
    else:
        from rl.common.data import TuningData

        data = TuningData.open(dataset)
        indexes, examples = data.indexes, data.dataset.examples
    if dataset:
        gold = gold_by_question(examples)
    weight = PII_LEAK_WEIGHT if pii_penalty is None else pii_penalty
    hook = leak_counter if weight else None
    rows, lines = read_log(log)
    ev = ReplayEvaluator(indexes, gold=gold, relevancy=relevancy, policy=tuner,
                         pii_leaks=hook, pii_weight=weight, thresholds=cfg.thresholds,
                         latency_slo_ms=cfg.slo.latency_ms, ci=cfg.offline_ci)
    return ev.compare(rows, stable, cand, source=str(log), lines=lines, limit=limit)
