"""`ragpilot rollout status|start|replay|advance|rollback`: evidence-gated promotion from the shell.

    ragpilot rollout start --candidate runs/tune-hotpot/best_config.yaml --stable 9c1d2e3f4a5b \\
        --manifest configs/splits/hotpotqa.json [--config configs/rl/rollout.yaml]
    ragpilot rollout status [--json]
    ragpilot rollout replay --log runs/serve/interactions.jsonl --index runs/index \\
        --candidate runs/tune-hotpot/best_config.yaml      # -> runs/rollout/replay_report.json
    ragpilot rollout advance --evidence runs/offline_report.json      # candidate -> shadow
    ragpilot rollout advance --evidence runs/serve/interactions.jsonl # shadow / canary batches
    ragpilot rollout rollback --reason "p95 regression seen on the dashboard"

State lives in `--state-dir` (default runs/rollout): `state.json` (resumable) and `audit.jsonl`
(append-only, one line per transition). `--evidence` takes EvaluationReport JSON
(`rl.promotion.evaluators`; one object, a list, or JSONL of them) or an interaction export
(`ragpilot export-interactions`, JSONL rows), which is turned into one report of the stage's
kind: offline (IPS over the whole log), shadow (paired mirrored rows) or canary (split rows).
A row's reward (and `scores[--reward-key]`) loses `--pii-penalty` (default 1.0) per PII leak
of its answer (`scores.pii_leaks`, `rl.tuner.reward.feedback_reward`), as the serving bandit does.
`replay` re-asks every logged, served question of the stable config of the candidate config
over the served index (`rl.promotion.replay.ReplayEvaluator`: paired, both answers scored alike) and
writes an offline report for `advance --evidence`; it defaults `--stable`, the gates and the
SLO to the active rollout's and refuses a candidate or stable that is not the rollout's.
Shadow/canary use only rows newer than the state's `row_cursor` (the newest row already
counted, reset at every transition), so a cumulative export can be passed again safely.
Exit codes: 0 advanced (or, for status/start/replay/rollback, done); 1 evidence did not suffice or
the rollout was rolled back (the message says why); 2 bad input, naming the field.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from rag.errors import ConfigError

DEFAULT_DIR = "runs/rollout"
_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def _config_id(flag: str, value: str) -> str:
    """A RAG config YAML path -> its config hash; otherwise the value must be a variant id."""
    p = Path(value)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        from rag.config import RAGConfig

        if not p.exists():
            raise ConfigError(flag, f"file {p} does not exist")
        return RAGConfig.from_yaml(p).config_hash
    if not _ID.match(value):
        raise ConfigError(flag, f"must be a config hash / variant id or a config YAML, got "
                                f"{value!r}")
    return value


def _manifest_id(value: str | None) -> str:
    if not value:
        return "unknown"
    p = Path(value)
    if p.exists():
        return f"{p.stem}@{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}"
    if not _ID.match(value):
        raise ConfigError("--manifest", f"must be a manifest file or an id, got {value!r}")
    return value


def router_settings(sm: Any) -> dict[str, Any]:
    """Body for `Router.set_traffic` / `POST /admin/traffic` at the rollout's stage. At `full`
    the candidate *is* the stable (its 100% share), so no canary share is left."""
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


def _print_apply(sm: Any) -> None:
    print("apply on the Serve app: curl -s -XPOST 127.0.0.1:8000/admin/traffic "
          "-H \"Authorization: Bearer $RAGPILOT_ADMIN_KEY\" -H 'content-type: application/json' "
          f"-d '{json.dumps(traffic_body(sm))}'")


# --------------------------------------------------------------------------- evidence files


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise ConfigError("--evidence", f"file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            out = []
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ConfigError("--evidence", f"{path}:{i}: not JSON ({exc.msg})"
                                          ) from None
            return out
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("--evidence", f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    records = data if isinstance(data, list) else [data]
    if not all(isinstance(r, dict) for r in records):
        raise ConfigError("--evidence", f"{path}: expected JSON objects")
    return records


def penalize_pii(rows: list[dict[str, Any]], reward_key: str | None = None,
                 weight: float | None = None) -> list[dict[str, Any]]:
    """Rows whose `reward` (and `scores[reward_key]`) carry the PII-leak penalty
    (`rl.tuner.reward.feedback_reward`); rows without leaks are returned as they are."""
    from rl.tuner.reward import PII_LEAK_WEIGHT, feedback_reward
    from serving.store import pii_leaks_of

    w = PII_LEAK_WEIGHT if weight is None else float(weight)
    if not w >= 0:
        raise ConfigError("--pii-penalty", f"must be >= 0, got {weight!r}")
    out = []
    for r in rows:
        leaks = pii_leaks_of(r.get("scores"))
        if leaks > 0 and w > 0:
            r = dict(r)
            if r.get("reward") is not None:
                r["reward"] = feedback_reward(float(r["reward"]), leaks, w)
            sc = r.get("scores")
            if reward_key and isinstance(sc, dict) and sc.get(reward_key) is not None:
                r["scores"] = {**sc, reward_key: feedback_reward(float(sc[reward_key]), leaks,
                                                                 w)}
        out.append(r)
    return out


def reports_from_file(path: str | Path, sm: Any, reward_key: str | None = None,
                      thresholds: Any = None, pii_penalty: float | None = None) -> list[Any]:
    """EvaluationReports from an evidence file, for the rollout's current stage (interaction
    rows: rewards penalised for PII leaks, `penalize_pii`)."""
    from rl.promotion.evaluators import (
        CanaryEvaluator,
        EvaluationReport,
        ShadowEvaluator,
    )
    from rl.promotion.log_evaluators import arms_from_rows, offline_from_log
    from rl.promotion.state_machine import KIND

    recs = _read_json_records(Path(path))
    if not recs:
        raise ConfigError("--evidence", f"{path} is empty")
    if all("kind" in r and "candidate" in r for r in recs):
        return [EvaluationReport.from_dict(r) for r in recs]
    if not all("variant_id" in r for r in recs):
        raise ConfigError("--evidence", f"{path}: neither evaluation reports nor interaction "
                                        "rows (need 'kind'+'candidate' or 'variant_id')")
    recs = penalize_pii(recs, reward_key, pii_penalty)
    cfg, st = sm.config, sm.state
    kind = KIND.get(sm.stage, "canary")
    if kind == "offline":  # the logged history before the rollout is what IPS replays
        return [offline_from_log(recs, st.stable, st.candidate, thresholds=cfg.thresholds,
                                 latency_slo_ms=cfg.slo.latency_ms)]
    fresh = [r for r in recs if float(r.get("ts") or 0.0) > st.row_cursor]
    if not fresh:
        print(f"{path}: no interaction rows newer than the last batch counted "
              f"(ts > {st.row_cursor:.3f}); nothing added")
        return []
    recs = fresh
    st.row_cursor = max(float(r["ts"]) for r in recs)  # saved by the next observe
    ev_cls = ShadowEvaluator if kind == "shadow" else CanaryEvaluator
    ev = ev_cls(thresholds or cfg.thresholds, latency_slo_ms=cfg.slo.latency_ms)
    stable, cand = arms_from_rows(recs, st.stable, st.candidate, kind, reward_key)
    return [ev.evaluate(stable, cand, source=str(path))]


# --------------------------------------------------------------------------- commands


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "state_dir", None) or DEFAULT_DIR)


def _print_decision(d: Any) -> None:
    print(f"{d.action}: {d.from_stage} -> {d.to_stage}: {d.reason}")


def status_dict(state_dir: str | Path) -> dict[str, Any]:
    from rl.promotion.state_machine import PromotionStateMachine

    sm = PromotionStateMachine.load(state_dir)
    ok, why = sm.ready()
    return {"rollout_id": sm.state.rollout_id, "stage": sm.stage,
            "candidate": sm.state.candidate, "stable": sm.state.stable,
            "dataset_manifest_id": sm.state.manifest_id, "code_commit": sm.state.code_commit,
            "traffic": router_settings(sm), "ready": ok, "why": why,
            "evidence": sm.summary(), "history": sm.state.history,
            "audit_log": str(Path(state_dir) / "audit.jsonl")}


def cmd_status(args: argparse.Namespace) -> int:
    st = status_dict(_state_dir(args))
    if args.json:
        print(json.dumps(st, indent=2, default=str))
        return 0
    t = st["traffic"]
    print(f"rollout {st['rollout_id']}: {st['candidate']} (candidate) vs {st['stable']} "
          f"(stable), manifest {st['dataset_manifest_id']}, commit {st['code_commit'][:10]}")
    print(f"stage {st['stage']}: canary {t['canary_percent']:g}% ({t['canary']}), shadow "
          f"{t['shadow_percent']:g}% ({t['shadow']}), stable {t['stable']}")
    ev = st["evidence"]
    nums = {k: v for k, v in ev.items() if isinstance(v, (int, float)) and v is not None
            and not isinstance(v, bool)}
    print("evidence: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in nums.items()))
    print(f"{'ready to advance' if st['ready'] else 'not ready'}: {st['why']}")
    for h in st["history"][-5:]:
        print(f"  {h['time']} {h['action']}: {h['from']} -> {h['to']} ({h['reason']})")
    print(f"audit log: {st['audit_log']}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from rl.promotion.state_machine import DEFAULTS_PATH, PromotionSettings, PromotionStateMachine

    cfg = PromotionSettings.from_yaml(args.config or DEFAULTS_PATH)
    if args.mlflow:
        cfg = cfg.model_copy(update={"mlflow": True})
    sm = PromotionStateMachine.start(_state_dir(args), _config_id("--candidate", args.candidate),
                                     _config_id("--stable", args.stable),
                                     _manifest_id(args.manifest), cfg, force=args.force)
    print(f"started rollout {sm.state.rollout_id}: {sm.state.candidate} vs {sm.state.stable} "
          f"at stage candidate; state and audit log in {_state_dir(args)}")
    print("next: ragpilot rollout advance --evidence <offline report JSON>")
    return 0


def cmd_advance(args: argparse.Namespace) -> int:
    from rl.promotion.state_machine import PromotionStateMachine

    sm = PromotionStateMachine.load(_state_dir(args))
    if sm.done:
        print(f"refused: rollout is {sm.stage}; start a new one")
        return 1
    reports = [r for path in args.evidence
               for r in reports_from_file(path, sm, args.reward_key,
                                          pii_penalty=getattr(args, "pii_penalty", None))]
    for rep in reports:
        d = sm.observe(rep)
        if d.action == "rollback":
            _print_decision(d)
            print("rolled back: set the router to stable only (see "
                  "runbooks/canary_promotion.md)")
            _print_apply(sm)
            return 1
        if d.action == "advance":  # auto_advance configured
            _print_decision(d)
            return 0
    d = sm.advance()
    _print_decision(d)
    if d.action == "advance":
        t = router_settings(sm)
        print(f"apply traffic: canary {t['canary_percent']:g}%, shadow {t['shadow_percent']:g}%"
              f" (canary={t['canary']}, shadow={t['shadow']}, stable={t['stable']})")
        _print_apply(sm)
        return 0
    return 1


def cmd_rollback(args: argparse.Namespace) -> int:
    from rl.promotion.state_machine import PromotionStateMachine

    if not args.reason or not args.reason.strip():
        raise ConfigError("--reason", "a rollback needs a reason")
    sm = PromotionStateMachine.load(_state_dir(args))
    d = sm.rollback(f"manual: {args.reason}")
    _print_decision(d)
    if d.action == "rollback":
        print(f"stable {sm.state.stable} serves everything again once applied"
              + (" (the rollout was at full: the router's stable must be set back)"
                 if d.from_stage == "full" else ""))
        _print_apply(sm)
    return 0 if d.action == "rollback" else 1


def _active_rollout(state_dir: Path) -> Any:
    """The rollout in `state_dir` when one is active (not full / rolled back), else None."""
    from rl.promotion.state_machine import STATE_FILE, PromotionStateMachine

    if not (state_dir / STATE_FILE).exists():
        return None
    sm = PromotionStateMachine.load(state_dir)
    return None if sm.done else sm


_REPLAY_FLAGS = {"stable": "--stable", "rows": "--log", "relevancy": "--relevancy",
                 "limit": "--limit", "pii_weight": "--pii-penalty"}


def replay_report(args: argparse.Namespace) -> Any:
    """The offline EvaluationReport of `ragpilot rollout replay` (`rl.promotion.replay`)."""
    from rag.config import RAGConfig
    from rl.promotion.replay import ReplayEvaluator, normalise_question, read_log
    from rl.promotion.state_machine import DEFAULTS_PATH, PromotionSettings
    from rl.tuner.reward import PII_LEAK_WEIGHT
    from rl.tuner.settings import TunerSettings

    state_dir = _state_dir(args)
    sm = _active_rollout(state_dir)
    cand_path = Path(args.candidate)
    if not cand_path.is_file():
        raise ConfigError("--candidate", f"replay needs the candidate's RAG config YAML; "
                                         f"{args.candidate!r} is not a file")
    candidate = RAGConfig.from_yaml(cand_path)
    if args.stable:
        stable = _config_id("--stable", args.stable)
    elif sm is not None:
        stable = sm.state.stable
    else:
        raise ConfigError("--stable", f"required: no active rollout in {state_dir} to take "
                                      "the stable config hash from")
    if sm is not None and sm.stage == "candidate":
        for flag, got, want in (("--candidate", candidate.config_hash, sm.state.candidate),
                                ("--stable", stable, sm.state.stable)):
            if got != want:
                raise ConfigError(flag, f"config hash {got} is not the {flag[2:]} {want} of "
                                        f"the rollout in {state_dir} (another --state-dir "
                                        "replays outside it)")
    cfg = (PromotionSettings.from_yaml(args.config) if args.config
           else sm.config if sm is not None else PromotionSettings.from_yaml(DEFAULTS_PATH))
    policy = TunerSettings.from_yaml(args.policy) if args.policy else TunerSettings.defaults()
    if not args.index and not args.dataset:
        raise ConfigError("--index", "give the served index directory (--index DIR) or the "
                                     "served dataset (--dataset NAME)")
    gold: dict[str, Any] = {}
    if args.index:
        from rag.indexset import IndexSet

        indexes = IndexSet.open(args.index)
        if args.dataset:
            from rag.corpus.loaders import load_dataset

            examples = load_dataset(args.dataset).examples
    else:
        from rl.common.data import TuningData

        data = TuningData.open(args.dataset)
        indexes, examples = data.indexes, data.dataset.examples
    if args.dataset:
        gold = {normalise_question(e.question): e for e in examples}
    hook = None
    weight = PII_LEAK_WEIGHT if args.pii_penalty is None else args.pii_penalty
    if weight:
        from serving.pii import leak_count

        def hook(answer: str, question: str, contexts: Any) -> float:
            return float(leak_count(answer, question, contexts))

    rows, lines = read_log(args.log)
    try:
        ev = ReplayEvaluator(indexes, gold=gold, relevancy=args.relevancy, policy=policy,
                             pii_leaks=hook, pii_weight=weight, thresholds=cfg.thresholds,
                             latency_slo_ms=cfg.slo.latency_ms, ci=cfg.offline_ci)
        return ev.compare(rows, stable, candidate, source=str(args.log), lines=lines,
                          limit=args.limit)
    except ConfigError as exc:
        if exc.field in _REPLAY_FLAGS:
            raise ConfigError(_REPLAY_FLAGS[exc.field], exc.message) from None
        raise


def cmd_replay(args: argparse.Namespace) -> int:
    import sys

    rep = replay_report(args)
    out = Path(args.out) if args.out else _state_dir(args) / "replay_report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep.to_dict(), indent=2, default=str) + "\n")
    print(json.dumps(rep.to_dict(), indent=2, default=str))
    gates = ", ".join(f"{k}={'n/a' if v is None else 'pass' if v else 'FAIL'}"
                      for k, v in rep.gates.items())
    print(f"replayed {rep.n} logged requests of {rep.meta['stable_hash']} through "
          f"{rep.meta['candidate_hash']}: reward diff {rep.diff:+.4f}, {rep.ci:.0%} CI "
          f"[{rep.ci_low:+.4f}, {rep.ci_high:+.4f}]; gates {gates}", file=sys.stderr)
    print(f"wrote {out}; next: ragpilot rollout advance --state-dir {_state_dir(args)} "
          f"--evidence {out}", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("rollout", help="evidence-gated promotion: status | start | replay | "
                                       "advance | rollback")
    rs = p.add_subparsers(dest="rollout_cmd", required=True)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("--state-dir", default=DEFAULT_DIR,
                       help="state.json and audit.jsonl (default runs/rollout)")

    s = rs.add_parser("status", help="stage, traffic split, evidence, what is missing")
    common(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    s = rs.add_parser("start", help="begin a rollout of a candidate config at stage candidate")
    common(s)
    s.add_argument("--candidate", required=True, help="config hash or RAG config YAML")
    s.add_argument("--stable", required=True, help="config hash or RAG config YAML")
    s.add_argument("--manifest", help="dataset split manifest file (hashed) or an id")
    s.add_argument("--config", help="rollout policy YAML (configs/rl/rollout.yaml)")
    s.add_argument("--mlflow", action="store_true", help="also log transitions to MLflow")
    s.add_argument("--force", action="store_true", help="replace an active rollout")
    s.set_defaults(func=cmd_start)

    s = rs.add_parser("advance", help="add evidence, then move one stage up if it suffices")
    common(s)
    s.add_argument("--evidence", action="append", default=[], metavar="FILE",
                   help="EvaluationReport JSON/JSONL or an interaction export (repeatable)")
    s.add_argument("--reward-key", help="take the reward from scores[KEY] (shadow rows)")
    s.add_argument("--pii-penalty", type=float, default=None, metavar="W",
                   help="reward lost per PII leak of a row's answer (default 1.0, "
                        "rl.tuner.reward.PII_LEAK_WEIGHT; 0: off)")
    s.set_defaults(func=cmd_advance)

    s = rs.add_parser("replay", help="offline evidence: replay the logged stable requests "
                                     "through the candidate config; prints the report JSON")
    common(s)
    s.add_argument("--log", required=True, metavar="FILE",
                   help="interaction export (ragpilot export-interactions --out FILE)")
    s.add_argument("--candidate", required=True, help="the candidate's RAG config YAML")
    s.add_argument("--stable", help="stable config hash or YAML (default: the active "
                                    "rollout's)")
    s.add_argument("--index", metavar="DIR", help="the served index directory (context ids "
                                                  "of the log are resolved in it)")
    s.add_argument("--dataset", help="the served dataset: its indexes (without --index) and "
                                     "gold answers (EM/F1 in the report)")
    s.add_argument("--relevancy", default="answer_relevancy",
                   help="R of the reward: answer_relevancy (RAGAS, default) | f1 (gold; "
                        "needs --dataset, replays only questions with gold)")
    s.add_argument("--limit", type=int, help="replay only the newest N replayable rows")
    s.add_argument("--config", help="rollout policy YAML for the gates and SLO (default: the "
                                    "active rollout's, else configs/rl/rollout.yaml)")
    s.add_argument("--policy", help="tuner policy YAML for the reward weights (default "
                                    "configs/rl/policy.defaults.yaml)")
    s.add_argument("--pii-penalty", type=float, default=None, metavar="W",
                   help="reward lost per PII leak of an answer (default 1.0; 0: off)")
    s.add_argument("--out", help="report JSON (default <state-dir>/replay_report.json)")
    s.set_defaults(func=cmd_replay)

    s = rs.add_parser("rollback", help="roll the candidate back now (recorded in the audit log)")
    common(s)
    s.add_argument("--reason", required=True)
    s.set_defaults(func=cmd_rollback)


def main(argv: list[str] | None = None) -> int:
    """`python -m serving.rollout_cmd rollout ...`: the same commands without the full CLI
    (bad input -> `error: <field>: <message>` on stderr and exit code 2, like `ragpilot`)."""
    import sys

    from rag.errors import RagError

    parser = argparse.ArgumentParser(prog="ragpilot")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
