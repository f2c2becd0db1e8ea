"""Gate rules (issue 18, item 2: gates as constraints, with their evidence): does a config
chosen on the tuning split still pass the hard gates on held-out queries, and what do a margin
on the gates (`TunerSettings.gate_z`) or expected gates (`TunerSettings.gate_expected`) change?

    python bench/gate_margin.py            # HotpotQA, SciFact, MTRAG x 20 seeds x 3 rules
    python bench/gate_margin.py --quick    # < 2 min: synthetic, 2 seeds, a small budget

The project's default searcher (local-asha, `rl.tuner.ask_tell.run_search`, warm start from the
static default, 24 full valid splits of query-evaluations, as in bench/search.py) runs under
three rules for the faithfulness and relevancy gates of the reward it maximises: point (the
default: the batch mean must clear the threshold), margin (`gate_z` 1.645: the one-sided 95%
lower bound of the mean must) and expected (`gate_expected`: each gate costs its probability of
failing on a new batch of as many queries, so the reward is the expected one on new queries).
Every pick is then scored on the test split with the point reward (what production measures),
so the rules are compared on the same objective. Latency is priced with the cost model
bench/search.py committed for each dataset (`bench.common.evaluator`), so rewards equal
search.json's.

Rows per dataset and system (`local-asha` = point, `local-asha+gate_z=1.645`,
`local-asha+gate_expected`), means over seeds with bootstrap 95% CIs over seeds:
test_gate_fail_rate (share of picks that fail a hard gate on test), test_reward, test_quality
(αF + βR), test_tokens, valid_reward (point reward of the pick on the tuning split); and
`<rule> - local-asha` delta_test_reward / delta_test_quality / delta_test_tokens, paired by seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    CONVERSATIONAL,
    cost_model_used,
    evaluator,
    make_meta,
    metric_row,
    write_results,
)
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.kernel.space import ConfigSpace  # noqa: E402
from rl.tuner.ask_tell import run_search  # noqa: E402

DATASETS = ("hotpotqa", "scifact", "mtrag")
METHOD = "local-asha"
RULES = ({}, {"gate_z": 1.645}, {"gate_expected": True})
"""The gate rules compared: point (the default), the lower-bound margin, expected gates."""


def system_of(rule: dict[str, Any]) -> str:
    if rule.get("gate_z"):
        return f"{METHOD}+gate_z={rule['gate_z']:g}"
    return f"{METHOD}+gate_expected" if rule.get("gate_expected") else METHOD


def run_dataset(name: str, seeds: list[int], budget_x: float, log) -> dict[str, Any]:
    """Per gate rule and seed: the pick, its point reward on valid and its test metrics."""
    base = TunerSettings.defaults()
    plain_ev, provenance = evaluator(name, base)
    spec = plain_ev.reward_spec()  # the point reward every pick is scored with
    out: dict[str, Any] = {"dataset": name, "runs": {}, "cost_model": provenance}
    for rule in RULES:
        settings = base.model_copy(update=rule)
        ev = evaluator(name, settings)[0] if rule else plain_ev
        space = ConfigSpace(settings, conversational=name in CONVERSATIONAL)
        split, hold = ev.slice.tune_split, ev.slice.holdout_split
        budget = int(round(budget_x * len(ev.data.examples(split))))
        runs = []
        for seed in seeds:
            t0 = time.perf_counter()
            res = run_search(ev, space, METHOD, budget, seed, split,
                             start=settings.base_config())
            cfg = res.best_config
            valid = plain_ev.evaluate(cfg, split)
            test = plain_ev.evaluate(cfg, hold)
            runs.append({"seed": seed, "config_hash": cfg.config_hash,
                         "config": cfg.model_dump(mode="json"),
                         "search_reward": float(res.best_reward), "valid_reward": valid.reward,
                         "valid_relevancy": valid.relevancy,
                         "valid_faithfulness": valid.faithfulness,
                         "test_reward": test.reward,
                         "test_quality": float(spec.quality(test.faithfulness, test.relevancy)),
                         "test_tokens": test.cost, "test_relevancy": test.relevancy,
                         "test_faithfulness": test.faithfulness,
                         "test_gates_passed": bool(test.gates["passed"]),
                         "query_evals": res.query_evals,
                         "wall_s": time.perf_counter() - t0})
            log(f"[{name}] {system_of(rule)} seed {seed}: pick {cfg.config_hash} valid "
                f"{valid.reward:.4f} test {test.reward:.4f} gates "
                f"{'pass' if test.gates['passed'] else 'FAIL'} ({runs[-1]['wall_s']:.0f} s)")
        out["runs"][system_of(rule)] = runs
    out["cost_model"] = cost_model_used(plain_ev, provenance)
    return out


def rows_for(part: dict[str, Any]) -> list[dict]:
    ds, rows = part["dataset"], []
    per = {}
    for system, runs in part["runs"].items():
        v = {k: np.array([float(r[k]) for r in runs]) for k in (
            "test_reward", "test_quality", "test_tokens", "valid_reward")}
        v["test_gate_fail_rate"] = np.array([0.0 if r["test_gates_passed"] else 1.0
                                             for r in runs])
        per[system] = v
        for metric in ("test_gate_fail_rate", "test_reward", "test_quality", "test_tokens",
                       "valid_reward"):
            rows.append(metric_row(ds, system, metric, v[metric]))
    b = system_of(RULES[0])
    for rule in RULES[1:]:
        a = system_of(rule)
        if a in per and b in per:
            for metric in ("test_reward", "test_quality", "test_tokens"):
                rows.append(metric_row(ds, f"{a} - {b}", f"delta_{metric}",
                                       per[a][metric] - per[b][metric]))
    return rows


def _fmt(row: dict) -> str:
    if row["ci_low"] is None:
        return f"{row['value']:.4f}"
    return f"{row['value']:.4f} [{row['ci_low']:.4f}, {row['ci_high']:.4f}]"


def markdown(parts: list[dict], rows: list[dict]) -> str:
    by = {(r["dataset"], r["system"], r["metric"]): r for r in rows}
    intro = __doc__.split("\n\n")[2]  # the paragraph after the commands
    lines = [intro.strip(), "",
             "## Results", "",
             "| dataset | system | test gate failures | test reward | test quality | "
             "test tokens | valid reward |", "|---|---|---|---|---|---|---|"]
    for part in parts:
        ds = part["dataset"]
        for system in part["runs"]:
            cells = [_fmt(by[(ds, system, m)]) for m in (
                "test_gate_fail_rate", "test_reward", "test_quality", "test_tokens",
                "valid_reward")]
            lines.append(f"| {ds} | {system} | " + " | ".join(cells) + " |")
    lines += ["", "Paired by seed, against the point gates:", "",
              "| dataset | comparison | delta test reward | delta test quality | "
              "delta test tokens |", "|---|---|---|---|---|"]
    for part in parts:
        for rule in RULES[1:]:
            ds, s = part["dataset"], f"{system_of(rule)} - {system_of(RULES[0])}"
            if (ds, s, "delta_test_reward") in by:
                lines.append(f"| {ds} | {s} | " + " | ".join(
                    _fmt(by[(ds, s, f"delta_{m}")]) for m in (
                        "test_reward", "test_quality", "test_tokens")) + " |")
    lines += ["", "## Picks per seed", ""]
    for part in parts:
        for system, runs in part["runs"].items():
            fails = [r["seed"] for r in runs if not r["test_gates_passed"]]
            picks = len({r["config_hash"] for r in runs})
            lo = min(r["valid_relevancy"] for r in runs)
            lines.append(f"- {part['dataset']} / {system}: {picks} distinct picks over "
                         f"{len(runs)} seeds; seeds whose pick fails a gate on test: "
                         f"{fails or 'none'}; lowest valid relevancy of a pick {lo:.3f}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget-x", type=float, default=24.0)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    args = ap.parse_args()
    datasets = ["synthetic"] if args.quick else args.datasets.split(",")
    seeds = list(range(2 if args.quick else args.seeds))
    budget_x = 4.0 if args.quick else args.budget_x
    log = lambda m: print(m, flush=True)  # noqa: E731
    parts = [run_dataset(d, seeds, budget_x, log) for d in datasets]
    rows = [r for p in parts for r in rows_for(p)]
    meta = make_meta(0, {d: data_root() / d for d in datasets if d != "synthetic"},
                     {"quick": args.quick, "seeds": seeds, "budget_x": budget_x,
                      "method": METHOD, "rules": [system_of(r) for r in RULES],
                      "command": "python bench/gate_margin.py" + (" --quick" if args.quick
                                                                  else ""),
                      "parts": parts})
    write_results("gate_margin", rows, meta, "Gate rules: do tuned configs pass the gates on "
                  "held-out queries?", markdown(parts, rows))


if __name__ == "__main__":
    main()
