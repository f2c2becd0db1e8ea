"""What a tuning budget buys, counted two ways: evaluation steps, and distinct configs.

    python bench/tuning_budget.py            # HotpotQA, SciFact, MTRAG; 3 seeds per method
    python bench/tuning_budget.py --quick    # < 2 min: the synthetic world, a small space

`bench/tuning.py` gives every method 100 *steps* (one config on one 200-query batch), the way
`TunerEnv` counts. But a config's first evaluation computes its per-query table for the whole
valid split (0.4–1.6 s here) and every later visit reads that table (~1 ms): what a tuning run
costs is the number of *distinct configs* it evaluates. A method that revisits configs (PPO as
its policy sharpens, a bandit by design) spends steps on them that cost nothing. This benchmark
runs PPO, random search, Optuna TPE and UCB1 under both budgets (20% of the grid either way;
revisits capped at 10× the budget in steps) and reports, per method: % of the grid best on the
whole valid split (mean of seeds, min–max), seeds ≥ 99%, steps, distinct configs and wall time.
It answers whether PPO's shortfall in tuning.md comes from the search or from how the budget
is counted. Seeds 0..n-1, as tuning.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import plain_row, rerender, rerendered_note, write_results  # noqa: E402
from bench.tuning import run_all, run_arguments  # noqa: E402
from rag.env import configure_runtime_env  # noqa: E402
from rl.common.data import TuningData  # noqa: E402
from rl.kernel.evaluator import TunerEvaluator  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.tuner.baselines import grid_search  # noqa: E402
from rl.tuner.run import search  # noqa: E402

TITLE = "Tuning budgets: evaluation steps vs distinct configs"
UNITS = ("steps", "configs")
METHODS = ("ppo", "random", "optuna", "bandit-ucb")


def run_dataset(name: str, policy: TunerSettings, seeds: list[int], frac: float,
                rows: list) -> dict[str, Any]:
    ev = TunerEvaluator(TuningData.open(name), policy)
    t0 = time.perf_counter()
    grid = grid_search(ev)
    rewards = grid.extra["rewards"]
    best = max(rewards.values())
    # at least one PPO iteration and its read-out (the --quick space has only 56 configs)
    budget = max(policy.ppo.train_batch_size + policy.episode.length, int(frac * len(rewards)))
    print(f"[{name}] grid {len(rewards)} configs in {time.perf_counter() - t0:.0f}s, best "
          f"{best:.4f}, budget {budget}", flush=True)
    ds = f"{name}/valid"
    details: dict[str, Any] = {"grid_configs": len(rewards), "grid_best": best,
                               "budget": budget, "methods": {}}
    for method in METHODS:
        for unit in UNITS:
            pct, steps, distinct, wall = [], [], [], []
            for seed in seeds:
                t1 = time.perf_counter()
                r = search(ev, policy, method, budget, unit, seed).result
                wall.append(time.perf_counter() - t1)
                h = r.best_config.config_hash
                value = rewards[h] if h in rewards else ev.evaluate(r.best_config).reward
                pct.append(value / best)
                steps.append(r.evaluations)
                distinct.append(len({c["config_hash"] for c in r.curve}))
            system = f"{method}@{unit}"
            for metric, vals in (("pct_of_grid_best", pct), ("steps", steps),
                                 ("distinct_configs", distinct), ("wall_s", wall)):
                v = np.asarray(vals, dtype=float)
                rows.append({"dataset": ds, "system": system, "metric": metric,
                             "value": float(v.mean()), "ci_low": float(v.min()),
                             "ci_high": float(v.max()), "n": int(v.size)})
            rows.append(plain_row(ds, system, "seeds_at_99pct",
                                  sum(p >= 0.99 for p in pct), len(pct)))
            details["methods"][system] = {"pct_of_grid_best": pct, "steps": steps,
                                          "distinct_configs": distinct, "wall_s": wall}
            print(f"[{name}] {system}: {np.mean(pct):.1%} of grid best, steps {steps}, "
                  f"distinct {distinct}", flush=True)
    return details


def render(details: dict[str, Any], seeds: list[int]) -> str:
    out = ["% of grid best = the chosen config's reward on the whole valid split / the grid "
           "best's (mean of seeds, min–max in brackets). `steps` counts every evaluation "
           "(one config on a 200-query batch, tuning.py's unit); `configs` counts distinct "
           "configs, each a per-query table computed once (revisits read it; at most 10× the "
           "budget in steps, plus PPO's read-out episode). `seeds ≥ 99%` is strict (98.996% "
           f"is not 99%). Seeds {seeds}.", ""]
    for name, d in details.items():
        out += [f"## {name}", "",
                f"Grid: {d['grid_configs']} configs, best valid reward {d['grid_best']:.4f}; "
                f"budget {d['budget']} in either unit.", "",
                "| method | budget unit | % of grid best | seeds ≥ 99% | steps | distinct configs "
                "| wall s |", "|---|---|---|---|---|---|---|"]
        for system, m in d["methods"].items():
            method, unit = system.split("@")
            p = np.asarray(m["pct_of_grid_best"])
            out.append(f"| {method} | {unit} | {p.mean():.2%} [{p.min():.2%}, {p.max():.2%}] | "
                       f"{int((p >= 0.99).sum())}/{p.size} | "
                       f"{'/'.join(str(x) for x in m['steps'])} | "
                       f"{'/'.join(str(x) for x in m['distinct_configs'])} | "
                       f"{np.mean(m['wall_s']):.0f} |")
        out.append("")
    return "\n".join(out)


def body(meta: dict[str, Any], note: str = "") -> str:
    return (f"{note}\n\n" if note else "") + render(meta["details"], meta["seeds"]) + \
        f"\nWall time {meta['wall_s'] / 60:.1f} min."


def main() -> None:
    args = run_arguments()
    if args.render_only:
        rerender("tuning_budget", args.quick, TITLE,
                 lambda meta, rows: body(meta, rerendered_note("tuning_budget", args.quick)))
        return
    configure_runtime_env()
    rows, meta = run_all(args, lambda name, policy, seeds, rows: run_dataset(
        name, policy, seeds, args.budget_frac, rows))
    write_results("tuning_budget", rows, meta, TITLE, body(meta))


if __name__ == "__main__":
    main()
