"""`ragpilot rollout status|start|replay|advance|rollback`: evidence-gated promotion from the shell.

    ragpilot rollout start --candidate runs/tune-hotpot/best_config.yaml --stable 9c1d2e3f4a5b \\
        --manifest configs/splits/hotpotqa.json [--config configs/rl/rollout.yaml]
    ragpilot rollout status [--json]
    ragpilot rollout replay --log runs/serve/interactions.jsonl --index runs/index \\
        --candidate runs/tune-hotpot/best_config.yaml      # -> runs/rollout/replay_report.json
    ragpilot rollout advance --evidence runs/offline_report.json      # candidate -> shadow
    ragpilot rollout advance --evidence runs/serve/interactions.jsonl # shadow / canary batches
    ragpilot rollout rollback --reason "p95 regression seen on the dashboard"

A thin shell over `rl.promotion.service` (the same operations as the Serve app's
`/admin/rollout*` endpoints): this module parses flags, prints, and picks exit codes.
State lives in `--state-dir` (default runs/rollout): `state.json` (resumable) and `audit.jsonl`
(append-only, one line per transition). `--evidence` takes EvaluationReport JSON or an
interaction export (`rl.promotion.evidence`: rows become one report of the stage's kind, their
rewards lose `--pii-penalty` (default 1.0) per PII leak, and shadow/canary count only rows newer
than the last batch, so a cumulative export can be passed again safely).
`replay` re-asks every logged, served question of the stable config of the candidate config
over the served index (`rl.promotion.service.replay_report`) and writes an offline report for
`advance --evidence`; it defaults `--stable`, the gates and the SLO to the active rollout's and
refuses a candidate or stable that is not the rollout's.
Exit codes: 0 advanced (or, for status/start/replay/rollback, done); 1 evidence did not suffice or
the rollout was rolled back (the message says why); 2 bad input, naming the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rl.promotion import service
from rl.promotion.service import DEFAULT_DIR, RolloutClosed
from serving.cli.common import add_settings_argument, flags, tuner_settings

# library field -> the flag a user typed
FLAGS = {"candidate": "--candidate", "stable": "--stable", "manifest": "--manifest",
         "reason": "--reason", "evidence": "--evidence", "pii_penalty": "--pii-penalty",
         "pii_weight": "--pii-penalty", "index": "--index", "rows": "--log",
         "relevancy": "--relevancy", "limit": "--limit"}


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "state_dir", None) or DEFAULT_DIR)


def _print_decision(d: Any) -> None:
    print(f"{d.action}: {d.from_stage} -> {d.to_stage}: {d.reason}")


def _print_apply(sm: Any) -> None:
    print("apply on the Serve app: curl -s -XPOST 127.0.0.1:8000/admin/traffic "
          "-H \"Authorization: Bearer $RAGPILOT_ADMIN_KEY\" -H 'content-type: application/json' "
          f"-d '{json.dumps(service.traffic_body(sm))}'")


def cmd_status(args: argparse.Namespace) -> int:
    st = service.status(_state_dir(args))
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
    with flags(FLAGS):
        sm = service.start(_state_dir(args), service.config_id(args.candidate, "candidate"),
                           service.config_id(args.stable, "stable"),
                           service.manifest_id(args.manifest),
                           service.settings(args.config, mlflow=args.mlflow), force=args.force)
    print(f"started rollout {sm.state.rollout_id}: {sm.state.candidate} vs {sm.state.stable} "
          f"at stage candidate; state and audit log in {_state_dir(args)}")
    print("next: ragpilot rollout advance --evidence <offline report JSON>")
    return 0


def cmd_advance(args: argparse.Namespace) -> int:
    from rl.promotion.evidence import Evidence, reports_from_file

    sm = service.load(_state_dir(args))
    if sm.done:
        print(f"refused: rollout is {sm.stage}; start a new one")
        return 1
    evidence = Evidence()
    with flags(FLAGS):
        for path in args.evidence:
            evidence += reports_from_file(path, sm, args.reward_key,
                                          pii_penalty=args.pii_penalty)
    for note in evidence.notes:
        print(note)
    try:
        d = service.advance(sm, evidence.reports)
    except RolloutClosed as exc:
        print(f"refused: {exc}")
        return 1
    _print_decision(d)
    if d.action == "rollback":
        print("rolled back: set the router to stable only (see runbooks/canary_promotion.md)")
        _print_apply(sm)
        return 1
    if d.action == "advance":
        t = service.router_settings(sm)
        print(f"apply traffic: canary {t['canary_percent']:g}%, shadow {t['shadow_percent']:g}%"
              f" (canary={t['canary']}, shadow={t['shadow']}, stable={t['stable']})")
        _print_apply(sm)
        return 0
    return 1


def cmd_rollback(args: argparse.Namespace) -> int:
    with flags(FLAGS):
        service.check_reason(args.reason)  # before the state: bad input names the flag
    sm = service.load(_state_dir(args))
    d = service.rollback(sm, f"manual: {args.reason}")
    _print_decision(d)
    if d.action == "rollback":
        print(f"stable {sm.state.stable} serves everything again once applied"
              + (" (the rollout was at full: the router's stable must be set back)"
                 if d.from_stage == "full" else ""))
        _print_apply(sm)
    return 0 if d.action == "rollback" else 1


def _leak_count(answer: str, question: str, contexts: Any) -> float:
    from serving.pii import leak_count

    return float(leak_count(answer, question, contexts))


def cmd_replay(args: argparse.Namespace) -> int:
    with flags(FLAGS):
        rep = service.replay_report(
            args.log, args.candidate, _state_dir(args), stable=args.stable, index=args.index,
            dataset=args.dataset, relevancy=args.relevancy, limit=args.limit,
            config=args.config, tuner_settings=tuner_settings(args), pii_penalty=args.pii_penalty,
            leak_counter=_leak_count)
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
                        "rl.kernel.reward.PII_LEAK_WEIGHT; 0: off)")
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
    add_settings_argument(s, "tuner settings YAML for the reward weights (default "
                             "configs/rl/tuner.yaml)")
    s.add_argument("--pii-penalty", type=float, default=None, metavar="W",
                   help="reward lost per PII leak of an answer (default 1.0; 0: off)")
    s.add_argument("--out", help="report JSON (default <state-dir>/replay_report.json)")
    s.set_defaults(func=cmd_replay)

    s = rs.add_parser("rollback", help="roll the candidate back now (recorded in the audit log)")
    common(s)
    s.add_argument("--reason", required=True)
    s.set_defaults(func=cmd_rollback)
