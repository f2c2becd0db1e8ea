"""`ragpilot rollout status|start|replay|advance|rollback`: evidence-gated promotion from the shell.

    ragpilot rollout start --candidate runs/tune-hotpot/best_config.yaml --stable 9c1d2e3f4a5b \\
        --manifest configs/splits/hotpotqa.json [--offline REPORT] [--config configs/rl/rollout.yaml]
    ragpilot rollout status [--json]
    ragpilot rollout replay --log runs/serve/interactions.jsonl --index runs/index \\
        --candidate runs/tune-hotpot/best_config.yaml      # -> runs/rollout/replay_report.json
    ragpilot rollout advance --evidence runs/offline_report.json      # candidate -> shadow
    ragpilot rollout advance                    # shadow / canary: reads the server's own store
    ragpilot rollout rollback --reason "p95 regression seen on the dashboard"

A thin shell over `rl.promotion.service` (the same operations as the Serve app's
`/admin/rollout*` endpoints): this module parses flags, prints, and picks exit codes.
State lives in `--state-dir` (default runs/rollout): `state.json` (resumable) and `audit.jsonl`
(append-only, one line per transition). The server is the one `--serve-config` describes (default
configs/serve/default.yaml): its address (`http_options`, or `--url`) goes into every printed
command, and its interaction store (`store_url`, or `--store`) is where `start` checks that the
stable config is served and where `advance` reads shadow / canary evidence when no `--evidence`
is given (`rl.promotion.evidence.reports_from_store`; rows newer than the last batch counted, so
a row counts at most once). `--evidence` takes EvaluationReport JSON (a report counts once per
rollout) or an interaction export; rewards lose `--pii-penalty` (default 1.0) per PII leak.
`replay` re-asks every logged, served question of the stable config of the candidate config
over the served index (`rl.promotion.service.replay_report`) and writes an offline report for
`advance --evidence`; it defaults `--stable`, the gates and the SLO to the active rollout's and
refuses a candidate or stable that is not the rollout's.
Exit codes: 0 advanced (or, for status/start/replay/rollback, done); 1 evidence did not suffice,
the rollout was rolled back, or the replayed candidate fails a gate (the message says why); 2 bad
input, naming the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.resources import default_config
from rl.promotion import service
from rl.promotion.service import DEFAULT_DIR, RolloutClosed
from rl.promotion.state_machine import STATE_FILE
from serving.cli.common import add_settings_argument, flags, tuner_settings

# library field -> the flag a user typed
FLAGS = {"candidate": "--candidate", "stable": "--stable", "manifest": "--manifest",
         "reason": "--reason", "evidence": "--evidence", "pii_penalty": "--pii-penalty",
         "pii_weight": "--pii-penalty", "index": "--index", "rows": "--log",
         "relevancy": "--relevancy", "limit": "--limit", "store": "--store",
         "offline": "--offline"}
SERVE_CONFIG = default_config("serve/default.yaml")


def _serve_yaml(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(http_options, the first application's args) of `--serve-config` (default
    configs/serve/default.yaml); ConfigError `--serve-config` when it cannot be read."""
    from rag.settings_base import YamlSource

    path = getattr(args, "serve_config", None) or SERVE_CONFIG
    with flags({"config": "--serve-config"}):
        data = YamlSource.read(path, "config").data or {}
    apps = data.get("applications") or [{}]
    return data.get("http_options") or {}, (apps[0] or {}).get("args") or {}


def _state_dir(args: argparse.Namespace) -> Path:
    """`--state-dir`, else the server's `rollout_dir` when `--serve-config` is given (the
    state the app's /admin/rollout endpoints share), else runs/rollout."""
    if getattr(args, "state_dir", None):
        return Path(args.state_dir)
    if getattr(args, "serve_config", None):
        return Path(_serve_yaml(args)[1].get("rollout_dir") or DEFAULT_DIR)
    return Path(DEFAULT_DIR)


def server(args: argparse.Namespace) -> tuple[str, str]:
    """(base URL, interaction store URL) of the server `--serve-config` describes
    (`http_options.host` / `port`, the first application's `args.store_url`; Serve's and the
    app's defaults where unset), each replaced by `--url` / `--store` when given."""
    url, store = getattr(args, "url", None), getattr(args, "store", None)
    if url and store:
        return url.rstrip("/"), store
    http, app_args = _serve_yaml(args)
    host = http.get("host") or "127.0.0.1"
    return ((url or f"http://{host}:{int(http.get('port') or 8000)}").rstrip("/"),
            store or app_args.get("store_url") or "runs/serve/interactions.sqlite")


def served_stable(args: argparse.Namespace) -> str:
    """The config hash of the stable config `--serve-config` serves (its `base` + `stable`
    overrides)."""
    from serving.schemas import ServeSettings

    _, app_args = _serve_yaml(args)
    with flags({"config": "--serve-config"}):
        st = ServeSettings.from_args(app_args)
    return st.config(st.stable).config_hash


def _where(args: argparse.Namespace) -> str:
    """The flags naming this server and state, to repeat in a printed next command."""
    out = ""
    for flag, key in (("--serve-config", "serve_config"), ("--state-dir", "state_dir"),
                      ("--url", "url"), ("--store", "store")):
        if getattr(args, key, None):
            out += f" {flag} {getattr(args, key)}"
    return out


def _print_decision(d: Any) -> None:
    print(f"{d.action}: {d.from_stage} -> {d.to_stage}: {d.reason}")


def _print_apply(sm: Any, url: str) -> None:
    print(f"apply on the Serve app: curl -s -XPOST {url}/admin/traffic "
          "-H \"Authorization: Bearer $RAGPILOT_ADMIN_KEY\" -H 'content-type: application/json' "
          f"-d '{json.dumps(service.traffic_body(sm))}'")


def _print_judgements(summary: dict[str, Any]) -> None:
    for j in summary.get("metrics") or []:
        print(f"  {j['statistic']}" + (" [critical]" if j["critical"] else ""))


def served_variants(store_url: str) -> set[str]:
    """Variant ids the server's own store shows serving (logged interactions) or deployed (its
    last routing state). ConfigError `store` when there is no store there."""
    from serving.store import open_store

    try:
        store = open_store(store_url, create=False)
    except ConfigError as exc:
        raise ConfigError("store", f"{exc.message}; is the server running? name its store "
                                   "with --store or --serve-config") from None
    out = {v["variant_id"] for v in store.variant_summary()}
    last = store.last_routing()
    state = (last or {}).get("state") or {}
    out |= {v for k, v in state.items() if k in ("stable", "canary", "shadow")
            and isinstance(v, str)}
    return out


def cmd_status(args: argparse.Namespace) -> int:
    if not (_state_dir(args) / STATE_FILE).exists():
        url, _ = server(args)
        if args.json:
            print(json.dumps({"stage": None, "state_dir": str(_state_dir(args))}))
            return 0
        print(f"no rollout in {_state_dir(args)} (server {url}); start one with: ragpilot "
              f"rollout start{_where(args)} --candidate <config YAML or hash>")
        return 0
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
    _print_judgements(ev)
    print(f"{'ready to advance' if st['ready'] else 'not ready'}: {st['why']}")
    for h in st["history"][-5:]:
        print(f"  {h['time']} {h['action']}: {h['from']} -> {h['to']} ({h['reason']})")
    print(f"audit log: {st['audit_log']}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from rl.promotion.evidence import read_records

    url, store = server(args)
    with flags(FLAGS):
        cand = service.config_id(args.candidate, "candidate")
        stable = (service.config_id(args.stable, "stable") if args.stable
                  else served_stable(args))
        cfg = service.settings(args.config, mlflow=args.mlflow)
        manifest = service.manifest_id(args.manifest)
        offline = None
        if args.offline:
            from rl.promotion.evaluators import EvaluationReport

            recs = read_records(args.offline)
            if len(recs) != 1:
                raise ConfigError("offline", f"{args.offline} must hold one report, "
                                             f"has {len(recs)}")
            offline = EvaluationReport.from_dict(recs[0])
        serving = served_variants(store)
        if stable not in serving:
            raise ConfigError("stable", f"{stable} is not served by the server whose store is "
                                        f"{store} (it serves: {', '.join(sorted(serving)) or 'nothing yet'})")
        if not Path(args.candidate).exists() and cand not in serving:
            raise ConfigError("candidate", f"{cand} is not deployed on the server whose store "
                                           f"is {store}; give the candidate's config YAML "
                                           "(its overrides deploy it) or deploy it first")
        sm = service.start(_state_dir(args), cand, stable, manifest, cfg, force=args.force)
    print(f"started rollout {sm.state.rollout_id}: {sm.state.candidate} vs {sm.state.stable} "
          f"at stage candidate; state and audit log in {_state_dir(args)}")
    _print_plan(sm, offline)
    print(f"next: ragpilot rollout advance{_where(args)} --evidence "
          f"{args.offline or '<offline report JSON: ragpilot rollout replay ...>'}")
    return 0


def _print_plan(sm: Any, offline: Any) -> None:
    """Per metric, the requests its verdict needs at the offline effect size (before anything
    starts), and each stage's plan."""
    from rl.promotion.metrics import MetricStats, requests_needed
    from rl.stats.always_valid import mean_se

    cfg = sm.config
    stages = ", ".join(f"{name} {getattr(cfg.stages, name).min_n}-"
                       f"{getattr(cfg.stages, name).max_n}" for name in ("shadow", "canary_5",
                                                                         "canary_25"))
    print(f"plan: per-metric always-valid confidence sequences at alpha {cfg.alpha:g}; "
          f"observations per stage (min-max): {stages}")
    if offline is None or not offline.metrics:
        print("requests needed per metric: pass --offline <report with per-metric statistics "
              "(ragpilot rollout replay)> to size them at the offline effect")
        return
    effects, sds, means = {}, {}, {}
    for name, d in offline.metrics.items():
        st = MetricStats.from_dict(d, f"offline.metrics.{name}")
        if st.paired and st.n >= 2:
            m, se = mean_se(st.n, st.d_sum, st.d_sumsq)
            effects[name], sds[name] = float(m), float(se) * float(st.n) ** 0.5
            means[name] = st.s_sum / st.s_n
    need = requests_needed(cfg.metrics, effects, sds, means, cfg.alpha)
    print("requests needed per metric at the offline effect (paired, 80% power):")
    for name, rule in cfg.metrics.items():
        if name not in effects:
            print(f"  {name}: not in the offline report")
            continue
        if rule.judged_on == "served":  # a mirrored answer's timing measures the mirroring
            print(f"  {name}: offline Δ {effects[name]:+.3g}: judged on served canary "
                  "requests (a guardrail: shown worse rolls back)")
            continue
        n = need[name]
        what = ("better" if rule.objective and (effects[name] > 0) == (rule.direction ==
                                                                       "higher")
                and effects[name] != 0 else "non-inferior")
        n = None if n is None else max(n, cfg.stages.shadow.min_n)
        print(f"  {name}: offline Δ {effects[name]:+.3g} (sd {sds[name]:.2g}): "
              + (f"~{n:,} mirrored requests to show {what}" if n is not None and n < 10**7
                 else "no sample size shows it at this effect"))


def cmd_advance(args: argparse.Namespace) -> int:
    from rl.promotion.evidence import Evidence, reports_from_file, reports_from_store

    url, store = server(args)
    sm = service.load(_state_dir(args))
    if sm.done:
        print(f"refused: rollout is {sm.stage}; start a new one")
        return 1
    evidence = Evidence()
    with flags(FLAGS):
        for path in args.evidence:
            evidence += reports_from_file(path, sm, pii_penalty=args.pii_penalty)
        if not args.evidence and sm.stage != "candidate":
            from serving.store import open_store

            served_variants(store)  # a missing store is named before anything is read
            evidence += reports_from_store(store, sm, args.pii_penalty, open_store)
    for note in evidence.notes:
        print(note)
    try:
        d = service.advance(sm, evidence.reports)
    except RolloutClosed as exc:
        print(f"refused: {exc}")
        return 1
    _print_decision(d)
    _print_judgements(d.evidence)
    sd = _where(args)
    if d.action == "rollback":
        print("rolled back: set the router to stable only (see runbooks/canary_promotion.md)")
        _print_apply(sm, url)
        return 1
    if d.action == "advance":
        t = service.router_settings(sm)
        print(f"apply traffic: canary {t['canary_percent']:g}%, shadow {t['shadow_percent']:g}%"
              f" (canary={t['canary']}, shadow={t['shadow']}, stable={t['stable']})")
        _print_apply(sm, url)
        if not sm.done:
            print(f"next: send traffic, then ragpilot rollout advance{sd}")
        return 0
    if sm.stage == "candidate":  # judged on an offline report only, never on traffic
        print(f"next: ragpilot rollout replay{sd} --log <interaction export> --candidate "
              "<config YAML> (more logged requests narrow each metric's CI), then ragpilot "
              f"rollout advance{sd} --evidence <its report>")
        return 1
    print(f"next: more traffic, then ragpilot rollout advance{sd}")
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
        _print_apply(sm, server(args)[0])
    return 0 if d.action == "rollback" else 1


def _leak_count(answer: str, question: str, contexts: Any) -> float:
    from serving.pii import leak_count

    return float(leak_count(answer, question, contexts))


def _print_offline_judgement(args: argparse.Namespace, rep: Any) -> None:
    """On stderr, each metric's judgement of the replay report `rep` as the candidate stage
    makes it (the rollout config `--config`, else the active rollout's, else the defaults),
    and the stage's decision."""
    from rl.promotion.metrics import MetricStats
    from rl.promotion.state_machine import offline_judgement

    cfg = service.rollout_settings(_state_dir(args), args.config)
    stats = {k: MetricStats.from_dict(d, f"report.metrics.{k}") for k, d in rep.metrics.items()}
    judged, decision, why = offline_judgement(cfg, stats, rep.n)
    for j in judged:
        print(f"  {j.statistic}", file=sys.stderr)
    print(f"candidate stage: {decision}, {why}", file=sys.stderr)


def cmd_replay(args: argparse.Namespace) -> int:
    dataset, stable = args.dataset, args.stable
    if args.serve_config:  # the server's own dataset and stable, unless named
        if not args.index and not dataset:
            dataset = _serve_yaml(args)[1].get("dataset")
        if not stable and service.active(_state_dir(args)) is None:
            stable = served_stable(args)
    with flags(FLAGS):
        rep = service.replay_report(
            args.log, args.candidate, _state_dir(args), stable=stable, index=args.index,
            dataset=dataset, relevancy=args.relevancy, limit=args.limit,
            config=args.config, tuner_settings=tuner_settings(args), pii_penalty=args.pii_penalty,
            leak_counter=_leak_count)
    out = Path(args.out) if args.out else _state_dir(args) / "replay_report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep.to_dict(), indent=2, default=str) + "\n")
    print(json.dumps(rep.to_dict(), indent=2, default=str))
    gates = ", ".join(f"{k}={'n/a' if v is None else 'pass' if v else 'FAIL'}"
                      for k, v in rep.gates.items())
    print(f"replayed {rep.n} logged requests of {rep.meta['stable_hash']} through "
          f"{rep.meta['candidate_hash']}; gates {gates}", file=sys.stderr)
    _print_offline_judgement(args, rep)
    if not rep.gates_passed:
        print(f"wrote {out}; the candidate fails {', '.join(rep.failed_gates)}: advancing with "
              "this report rolls the rollout back (the gates are `thresholds` in the rollout "
              "config)", file=sys.stderr)
        return 1
    print(f"wrote {out}; next: ragpilot rollout advance{_where(args)} --evidence {out}",
          file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("rollout", help="evidence-gated promotion: status | start | replay | "
                                       "advance | rollback")
    rs = p.add_subparsers(dest="rollout_cmd", required=True)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("--state-dir", default=None,
                       help="state.json and audit.jsonl (default: --serve-config's "
                            "rollout_dir, else runs/rollout)")
        s.add_argument("--serve-config", default=None, metavar="FILE",
                       help="the server's Serve YAML: its address and interaction store "
                            "(default configs/serve/default.yaml)")
        s.add_argument("--url", help="the server's base URL (default: --serve-config's "
                                     "http_options)")
        s.add_argument("--store", help="the server's interaction store (default: "
                                       "--serve-config's store_url)")

    s = rs.add_parser("status", help="stage, traffic split, evidence, what is missing")
    common(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    s = rs.add_parser("start", help="begin a rollout of a candidate config at stage candidate")
    common(s)
    s.add_argument("--candidate", required=True, help="config hash or RAG config YAML")
    s.add_argument("--stable", help="config hash or RAG config YAML (default: the stable "
                                    "config --serve-config serves)")
    s.add_argument("--manifest", help="dataset split manifest file (hashed) or an id")
    s.add_argument("--config", help="rollout policy YAML (configs/rl/rollout.yaml)")
    s.add_argument("--offline", metavar="FILE",
                   help="the offline report (ragpilot rollout replay): prints the requests "
                        "each metric needs at its effect")
    s.add_argument("--mlflow", action="store_true", help="also log transitions to MLflow")
    s.add_argument("--force", action="store_true", help="replace an active rollout")
    s.set_defaults(func=cmd_start)

    s = rs.add_parser("advance", help="add evidence, then move one stage up if it suffices")
    common(s)
    s.add_argument("--evidence", action="append", default=[], metavar="FILE",
                   help="EvaluationReport JSON/JSONL or an interaction export (repeatable; "
                        "default at shadow / canary: the server's own store)")
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
                                    "rollout's, else the one --serve-config serves)")
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
