"""`ragpilot demo`: the control plane's loop end to end on the embedded defaults (synthetic
world; tantivy + FAISS + graph indexes; SQLite interaction log; local MLflow).

    index -> tune -> holdout report (+ the per-query router against the tuned config)
          -> serve (stable = default, canary = tuned)
          -> simulated users + feedback -> promotion (advance or roll back) -> summary

Each stage is a library call (serving.demo.offline, serving.demo.live; decisions come from
rl.promotion) shown with a progress indicator and a one-line result. Writes under `out`
(default runs/demo): summary.json (each stage's result: `tuned_config`, `holdout_delta` with its
CI, `router` (the per-query router's holdout rows and verdict), `promotion` with the decision
and the deciding statistic), report.html (self-contained: tables, Pareto and reward-curve PNGs
inline, the promotion timeline), tune/ (the tuning run), policy/ (the router's servable
policy directory and report.md),
rollout/ (state.json, audit.jsonl), serve/ (interactions.sqlite), mlflow/ (local store).

Budgets (2 cores, after set-up): the full run tunes with 40 valid splits of query-evaluations
(the first trial is the static default) and sends at most 400 simulated requests; `fast` tunes
with 16 and sends at most 300. The rollout policy is configs/rl/rollout.demo.yaml
(the production tests with stage sizes for a few hundred requests). Serve and Ray are shut down
on every exit, Ctrl-C included; a busy port is a ConfigError naming the port and `--port`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rag.errors import ConfigError

N_STAGES = 6


@dataclass(frozen=True)
class Budget:
    """How much the demo spends: the search's budget in full valid splits of
    query-evaluations, the most simulated requests, simulated users."""

    tune_splits: int
    max_requests: int
    users: int

    @classmethod
    def of(cls, fast: bool) -> Budget:
        return cls(16, 300, 100) if fast else cls(40, 400, 200)


class _Stages:
    """Prints `[i/N] name ...` with a spinner, then a one-line result with its seconds; keeps
    the records for summary.json."""

    def __init__(self, console: Console):
        self.console, self.records, self.i = console, [], 0

    @contextmanager
    def stage(self, name: str, doing: str, spinner: bool = True, counted: bool = True):
        """`spinner=False` for a stage that shows its own progress bar (rich allows one live
        display at a time); `counted=False` for a second step of the same stage."""
        self.i += counted
        t0 = time.perf_counter()
        box: dict[str, str] = {}
        what = f"[{self.i}/{N_STAGES}] {name}: {doing}"
        with self.console.status(what) if spinner else nullcontext():
            if not spinner:
                self.console.print(what)
            yield box
        secs = time.perf_counter() - t0
        self.records.append({"stage": name, "result": box.get("result", ""), "seconds": secs})
        self.console.print(f"[bold green]✓[/] [{self.i}/{N_STAGES}] [bold]{name}[/] "
                           f"({secs:.1f} s): {box.get('result', '')}")


def serve_args(out: Path, default: Any, tuned: Any) -> dict[str, Any]:
    """ServeSettings for the demo app: what `ragpilot tune`'s serve.yaml serves (stable =
    `default`, canary = `tuned` at 0%, the rollout sets the split; store and rollout dir under
    `out`: `serving.serve_yaml.tuned_args`), with its own key file and small limits."""
    from serving.serve_yaml import tuned_args

    return {**tuned_args("synthetic", default, tuned, out),
            "auth": {"keys_file": str(out / "serve" / "keys.json")},
            "limits": {"max_inflight": 8, "rate_per_s": 1000.0, "burst": 1000.0},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "max_variants": 4, "restore_routing": False}


def _quiet_weight_loading() -> None:
    """No "Loading weights" progress bars between the demo's stage lines: transformers' own
    switch for this process (it reads the environment only when imported) and the environment
    for the Ray workers and Serve replicas the demo starts."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # no model stack: nothing loads weights
        return
    hf_logging.disable_progress_bar()


def run_demo(out: Path = Path("runs/demo"), fast: bool = False, seed: int = 0,
             port: int = 8000, private_netns: bool = False, mlflow: bool = True,
             policy_checkpoint: str | Path | None = None,
             console: Console | None = None, warm_start: bool = True) -> dict[str, Any]:
    """Run the loop (module docstring); returns the summary (also out/summary.json).
    `policy_checkpoint`: a saved PPO policy; its greedy config replaces the searcher's best
    when its valid reward is higher. `warm_start`: the searcher's first trial is the default
    config (so "tuned" never did worse than it on the tuning batches; when nothing beats it,
    there is nothing to roll out and serve/promotion are skipped)."""
    from rl.kernel.settings import TunerSettings
    from rl.kernel.space import ConfigSpace
    from serving.demo import live, offline
    from serving.demo.html import write_report
    from serving.serve_yaml import changed_keys

    if console is None:  # piped output (CI logs) gets rich's 80 columns: too narrow here
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
    live.check_port(port)  # bad input before minutes of work, not after
    _quiet_weight_loading()
    if policy_checkpoint is not None and not Path(policy_checkpoint).is_dir():
        raise ConfigError("policy_checkpoint", f"{policy_checkpoint} is not a directory (save "
                                               "one with ragpilot tune --method ppo --checkpoint)")
    t0 = time.perf_counter()
    out = Path(out)
    for old in ("serve", "rollout"):  # a fresh app and rollout every run
        shutil.rmtree(out / old, ignore_errors=True)
    budget = Budget.of(fast)
    st = _Stages(console)
    console.print(f"[bold]ragpilot demo[/] ({'fast' if fast else 'full'}; seed {seed}): "
                  "index → tune → holdout → serve → users → promotion")
    with st.stage("index", "synthetic world, tantivy + FAISS + graph") as r:
        data = offline.index_stage()
        r["result"] = (f"{len(data.dataset.corpus)} passages, {len(data.dataset.examples)} "
                       f"questions ({', '.join(f'{k} {len(v)}' for k, v in data.splits.items())})"
                       f"; indexes in {data.indexes.root}")
    settings = TunerSettings.defaults()
    default = ConfigSpace(settings).base
    mlflow_dir = out / "mlflow" if mlflow else None
    if mlflow_dir is not None:
        from rl.common.tracking import tracking_uri

        console.print(f"  MLflow: mlflow ui --backend-store-uri {tracking_uri(mlflow_dir)}",
                      soft_wrap=True)  # a command to copy: never wrapped
    with st.stage("tune", f"{offline.SEARCHER} over the config space, {budget.tune_splits} "
                          "valid splits of query-evaluations") as r:
        run = offline.tune_stage(data, settings, budget.tune_splits, out / "tune", seed,
                                 mlflow_dir, warm_start=warm_start)
        tuned = run.best
        objective = run.summary.get("objective") or {}
        r["result"] = (f"{objective.get('kind', 'reward')} pick {tuned.config_hash} "
                       f"({tuned.variant}, k={tuned.k}, rerank={tuned.rerank}, "
                       f"w={tuned.fusion_weight}, {tuned.prompt_id}) from "
                       f"{objective.get('pareto_points', '?')} Pareto points after "
                       f"{run.summary['evaluations']} evaluations")
    source, learned = offline.SEARCHER, None
    if policy_checkpoint is None:
        console.print("  learned policy: none given (pass --policy-checkpoint DIR, saved by "
                      "ragpilot tune --method ppo --checkpoint); the searcher's best goes on")
    else:
        with st.stage("policy", f"learned policy from {policy_checkpoint}",
                      counted=False) as r:
            learned = offline.policy_stage(run, settings, policy_checkpoint, seed)
            better = learned.reward > run.valid.reward
            if better:
                from rag.config import RAGConfig

                tuned, source = RAGConfig.from_dict(learned.config), "ppo policy"
            r["result"] = (f"policy's config {learned.config_hash}: valid reward "
                           f"{learned.reward:.4f} vs the searcher's {run.valid.reward:.4f}: "
                           f"{'the policy' if better else 'the searcher'}'s goes on")
    with st.stage("holdout", "tuned vs default, paired bootstrap") as r:
        hold = offline.holdout_stage(run, tuned, default, out, seed)
        q = next(x for x in hold.rows if x["kind"] == "quality")
        c = next(x for x in hold.rows if x["metric"].startswith("cost"))
        said = objective.get("statement")
        r["result"] = ((f"{said}; " if said else "") +
                       f"quality {q['delta']:+.4f} [{q['ci_low']:+.4f}, {q['ci_high']:+.4f}]; "
                       f"cost {c['delta']:+.1f} tokens/query; (weighted reward "
                       f"{hold.reward['delta']:+.4f}) (n = {hold.n})")
    with st.stage("router", "per-query router over the config portfolio + the tuned config",
                  counted=False) as r:
        routed = offline.router_stage(tuned, settings, out / "policy", seed)
        vs = routed.systems[-1]  # the tuned config's arm
        g, q = routed.delta(vs), routed.delta(vs, "delta_quality")
        c = routed.delta(vs, "delta_cost_pct")
        r["result"] = (f"vs the tuned config: Δ reward {g['value']:+.4f} [{g['ci_low']:+.4f}, "
                       f"{g['ci_high']:+.4f}]; quality {q['value']:+.4f} [{q['ci_low']:+.4f}, "
                       f"{q['ci_high']:+.4f}]; tokens {c['value']:+.1f}% (n = {g['n']}); "
                       f"verdict: {routed.verdict}")
    summary: dict[str, Any] = {
        "seed": seed, "fast": fast, "budget": vars(budget),
        "tuned_config": {"config_hash": tuned.config_hash, "config": tuned.model_dump(
            mode="json"), "changed": changed_keys(tuned, default), "source": source,
            "searcher": offline.SEARCHER, "searcher_valid_reward": run.valid.reward,
            "policy_valid_reward": learned.reward if learned is not None else None,
            "holdout_reward": hold.reward["tuned_reward"],
            "evaluations": run.summary["evaluations"], "run_dir": str(run.out)},
        "default_config": {"config_hash": default.config_hash},
        "holdout_delta": {"split": hold.split, "n": hold.n, **hold.reward, "rows": hold.rows,
                          "gates": hold.gates},
        "router": routed.to_dict()}
    promo = _live(out, data, run, default, tuned, budget, seed, port, private_netns, console,
                  st)
    summary["promotion"] = promo
    summary["urls"] = promo.pop("urls", {})
    with st.stage("summary", "summary.json and report.html") as r:
        summary["stages"] = st.records + [{"stage": "summary", "result": "written",
                                           "seconds": 0.0}]
        summary["wall_s"] = time.perf_counter() - t0
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        write_report(out / "report.html", summary, hold.plots)
        r["result"] = f"{out}/summary.json, {out}/report.html"
    _print_summary(console, summary)
    return summary


def _live(out: Path, data: Any, run: Any, default: Any, tuned: Any, budget: Budget, seed: int,
          port: int, private_netns: bool, console: Console, st: _Stages) -> dict[str, Any]:
    """Stages serve and promotion: the app up, then users + evidence + the state machine until
    a decision or the request budget; Serve and Ray stopped on any exit. The promotion record
    (with `timeline` and `urls`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from rag.resources import default_config
    from rl.promotion import service
    from rl.promotion.evaluators import OfflineEvaluator
    from serving.demo import live

    if tuned.config_hash == default.config_hash:
        for name in ("serve", "promotion"):
            with st.stage(name, "skipped") as r:
                r["result"] = "skipped: the tuned config is the default (nothing to roll out)"
        return {"decision": "held", "stage": "none", "reason": "the tuned config is the "
                "default: nothing to roll out", "statistic": {}, "deciding": "",
                "timeline": [], "requests": 0}
    ev = run.evaluator
    policy = service.settings(default_config("rl/rollout.demo.yaml"))
    offline_report = OfflineEvaluator(ev, ci=policy.offline_ci).compare(
        default, tuned, ev.slice.holdout_split)
    with ExitStack() as stack:
        stack.callback(console.print, "  Serve and Ray stopped")  # runs after local_app's exit
        with st.stage("serve", f"Ray Serve on 127.0.0.1:{port}, stable = default, canary = "
                               "tuned") as r:
            url, key = stack.enter_context(live.local_app(serve_args(out, default, tuned),
                                                          port, private_netns))
            r["result"] = f"{url} ready"
        console.print(f"  Prometheus: {url}/metrics   API docs: {url}/docs", soft_wrap=True)
        users = live.SimulatedUsers(url, data.examples(ev.slice.holdout_split), seed,
                                    n_users=budget.users)
        loop = live.PromotionLoop(out / "rollout", url, key,
                                  out / "serve" / "interactions.sqlite", users, policy)
        with st.stage("promotion", "simulated users, evidence, state machine",
                      spinner=False) as r, \
                Progress(TextColumn("  users"), BarColumn(), MofNCompleteColumn(),
                         TextColumn("{task.description}"), console=console,
                         transient=True) as bar:
            task = bar.add_task("stage candidate", total=budget.max_requests)
            loop.start(tuned.config_hash, default.config_hash, offline_report)
            seen, finished = 0, False
            while True:
                for t in loop.timeline[seen:]:
                    move = (f"{t['from']} → {t['to']}" if t["to"] != t["from"]
                            else f"at {t['from']}")
                    console.print(f"  {t['action']} {move} after {t['requests']} requests: "
                                  f"{t['reason']}")
                seen = len(loop.timeline)
                if finished:
                    break
                if not loop.more_evidence(budget.max_requests):
                    loop.finish()  # no more evidence can come: the rollout ends here
                    finished = True
                    continue
                loop.step(lambda: bar.advance(task))
                bar.update(task, description=f"stage {loop.sm.stage}")
            promo = loop.outcome()
            r["result"] = (f"{promo['decision']} at {promo['last_stage']} after "
                           f"{promo['requests']} requests: {promo['reason']}")
    return {**promo, "timeline": loop.timeline, "user_errors": users.errors,
            "ratings": {k: {"n": len(v), "thumbs_up": sum(v)} for k, v in users.ratings.items()},
            "urls": {"serve": url, "metrics": f"{url}/metrics"}}


def _print_summary(console: Console, s: dict[str, Any]) -> None:
    from rich.markup import escape

    t, h, p = s["tuned_config"], s["holdout_delta"], s["promotion"]
    table = Table(title="ragpilot demo: what was learned and what was rolled out",
                  show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("tuned config", f"{t['config_hash']} ({t['source']}): " + ", ".join(
        f"{k}={v}" for k, v in t["changed"].items()))
    q = next(x for x in h["rows"] if x["kind"] == "quality")
    c = next(x for x in h["rows"] if x["metric"].startswith("cost"))
    table.add_row("holdout (test) Δ", f"quality {q['delta']:+.4f} [{q['ci_low']:+.4f}, "
                                      f"{q['ci_high']:+.4f}]; tokens/query {c['delta']:+.1f} "
                                      f"[{c['ci_low']:+.1f}, {c['ci_high']:+.1f}]; weighted "
                                      f"reward {h['delta']:+.4f} (n = {h['n']})")
    table.add_row("promotion", f"{p['decision']} (at {p.get('last_stage', p['stage'])}, "
                               f"{p['requests']} "
                               f"requests): {p['reason']}")
    table.add_row("deciding statistics",  # "[shadow] ..." is text, not rich markup
                  escape((p.get("deciding") or "—").replace("; ", "\n")))
    table.add_row("files", f"{s['tuned_config']['run_dir']}, report.html, summary.json")
    console.print(table)
