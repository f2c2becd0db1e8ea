"""Tuning benchmark: PPO vs static configs and vs baselines, on HotpotQA, SciFact and MTRAG.

    python bench/tuning.py           # full: 3 datasets, 3 seeds per method
    python bench/tuning.py --quick   # < 2 min: the synthetic world, a small space, 1 seed

Per dataset (tuning on the `valid` split, reporting on the `test` holdout):
  * the exhaustive grid over the discretised space (every config on the whole valid split):
    the ceiling of any static config, G evaluations;
  * PPO (RLlib), random search, Optuna TPE (Ray Tune's searcher), UCB1 and Thompson bandits,
    each with budget = 20% of G evaluations (one evaluation = a config on a 200-query batch);
    a baseline's answer is its incumbent (best mean observed reward); PPO's is its
    recommendation (greedy config vs incumbent by observed reward, see rl.ppo), and
    `ppo-greedy` scores the policy's greedy config itself;
  * evaluations until the incumbent reaches 95% / 99% of the grid best (full valid split);
  * holdout: reward of PPO's config vs the static default and vs the grid-best config, paired
    bootstrap 95% CI (10k resamples over test queries, batch reward recomputed per resample);
    gate verdicts of every promoted config on the holdout;
  * warm and cold step time, PPO wall time.
Writes bench/results/tuning.json, tuning.md and PNGs (reward curves, Pareto fronts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, make_meta, plain_row, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.env import configure_runtime_env  # noqa: E402
from rl.baselines import bandit_search, grid_search, optuna_search, random_search  # noqa: E402
from rl.env import TunerEnv  # noqa: E402
from rl.evaluation import TunerEvaluator, TuningData  # noqa: E402
from rl.policy import PolicyConfig  # noqa: E402
from rl.report import compare, evals_to_reach, plot_curves, plot_pareto  # noqa: E402
from rl.results import TuneResult  # noqa: E402
from rl.space import ConfigSpace  # noqa: E402

DATA_FILES = {"hotpotqa": "hotpotqa", "scifact": "scifact", "mtrag": "mtrag"}


def quick_policy() -> PolicyConfig:
    return PolicyConfig.defaults().with_overrides(
        k_grid=[3, 5, 8, 12], fusion_grid=0.25, fusion_step=0.25,
        discrete={"variant": ["bm25", "dense", "hybrid"], "rerank": ["off", "on"],
                  "prompt_id": ["cite_concise"]},
        ppo={**PolicyConfig().ppo.model_dump(), "train_batch_size": 10, "minibatch_size": 5})


def value_of(ev: TunerEvaluator, cfgs) -> dict[str, float]:
    return {c.config_hash: ev.evaluate(c).reward for c in cfgs}


def incumbent_curve(hist) -> list[dict]:
    """Incumbent = best mean observed reward so far (the rule baselines use)."""
    sums: dict[str, list[float]] = {}
    out = []
    for i, h in enumerate(hist, 1):
        sums.setdefault(h["config_hash"], []).append(h["reward"])
        inc = max(sums, key=lambda k: (np.mean(sums[k]), len(sums[k])))
        out.append({"eval": i, "incumbent": inc})
    return out


def run_dataset(name: str, policy: PolicyConfig, seeds: list[int], rows: list, md: list,
                frac: float) -> None:
    from rl.ppo import PPOTuner

    t_open = time.perf_counter()
    ev = TunerEvaluator(TuningData.open(name), policy)
    space = ConfigSpace(policy)
    split_n = {s: len(v) for s, v in ev.data.splits.items()}
    print(f"[{name}] splits {split_n}, opened in {time.perf_counter() - t_open:.1f}s", flush=True)

    t0 = time.perf_counter()
    grid = grid_search(ev, progress=lambda i: print(f"  grid {i}", flush=True)
                       if i % 100 == 0 else None)
    grid_wall = time.perf_counter() - t0
    rewards = grid.extra["rewards"]
    G = len(rewards)
    best_valid = max(rewards.values())
    budget = max(policy.ppo.train_batch_size, int(frac * G))
    # PPO spends its budget on training steps plus one greedy read-out episode
    iters = max(1, (budget - policy.episode.length) // policy.ppo.train_batch_size)
    default = space.base
    print(f"[{name}] grid {G} configs in {grid_wall:.0f}s; best {best_valid:.4f} "
          f"({grid.best_config.config_hash}); default {rewards.get(default.config_hash)}; "
          f"budget {budget}", flush=True)
    ds = f"{name}/valid"
    rows += [plain_row(ds, "grid", "reward", best_valid, split_n["valid"]),
             plain_row(ds, "grid", "evaluations", G, G),
             plain_row(ds, "static-default", "reward", ev.evaluate(default).reward,
                       split_n["valid"])]

    # ---- methods under the same budget ---------------------------------------------------
    results: dict[str, list] = {m: [] for m in ("ppo", "ppo-greedy", "random", "optuna",
                                                 "bandit-ucb", "bandit-thompson")}
    curves: dict[str, list[float]] = {}
    ppo_wall = []
    for seed in seeds:
        t0 = time.perf_counter()
        tuner = PPOTuner(ev, policy, seed=seed)
        res = tuner.train(iters)
        res.curve = [{**c, **inc} for c, inc in zip(res.curve, incumbent_curve(res.curve),
                                                      strict=True)]
        ppo_wall.append(time.perf_counter() - t0)
        if seed == seeds[0]:  # warm steps: actions whose config tables are already cached
            warm = []
            env = TunerEnv({"seed": 99}, evaluator=ev)
            env.reset()
            grid_cfgs = list(grid.extra["configs"].values())
            for j in range(50):
                t1 = time.perf_counter()
                env.step(space.to_action(grid_cfgs[(7 * j) % len(grid_cfgs)]))
                warm.append((time.perf_counter() - t1) * 1000)
            assert all(h["cached"] for h in env.history)
        tuner.stop()
        results["ppo"].append(res)
        # the policy's own greedy config, whether or not the recommendation kept it
        results["ppo-greedy"].append(TuneResult("ppo-greedy", res.extra["greedy_config"],
                                                res.evaluations, res.curve, res.wall_s))
        results["random"].append(random_search(ev, budget, seed))
        results["optuna"].append(optuna_search(ev, budget, seed))
        results["bandit-ucb"].append(bandit_search(ev, budget, seed, "ucb"))
        results["bandit-thompson"].append(bandit_search(ev, budget, seed, "thompson"))
        print(f"[{name}] seed {seed}: " + ", ".join(
            f"{m} {ev.evaluate(r[-1].best_config).reward:.4f}" for m, r in results.items()),
            flush=True)

    # cold step: a config hash never seen (rrf_k does not act under min-max fusion, so the
    # pipeline is the default's), retrieval memo warm: the whole valid table is computed
    cold_cfg = default.replace(rrf_k=1 + (int(time.time()) % 997))
    t1 = time.perf_counter()
    cold_cached = ev.is_cached(cold_cfg, ev.slice.tune_split)
    env_cold = split_n["valid"]
    ev.evaluate(cold_cfg, idx=np.arange(min(policy.episode.batch_size, env_cold)))
    cold_ms = (time.perf_counter() - t1) * 1000

    # ---- budgets to target -----------------------------------------------------------------
    table = []
    for m, rs in results.items():
        cfg_vals = value_of(ev, [r.best_config for r in rs])
        inc_vals = value_of(ev, [ev.seen[h] for h in {c["incumbent"] for r in rs
                                                       for c in r.curve}])
        vals = [cfg_vals[r.best_config.config_hash] for r in rs]
        reach95 = [evals_to_reach(r.curve, inc_vals, 0.95 * best_valid if best_valid > 0
                                  else best_valid - 0.05 * abs(best_valid)) for r in rs]
        reach99 = [evals_to_reach(r.curve, inc_vals, 0.99 * best_valid if best_valid > 0
                                  else best_valid - 0.01 * abs(best_valid)) for r in rs]
        curves[m] = [inc_vals.get(c["incumbent"], np.nan) for c in rs[0].curve]
        pct = [v / best_valid for v in vals] if best_valid > 0 else [np.nan] * len(vals)
        rows.append(_seed_row(ds, m, "reward", vals))
        rows.append(_seed_row(ds, m, "pct_of_grid_best", pct))
        rows.append(plain_row(ds, m, "evaluations", float(np.mean([r.evaluations for r in rs])),
                              len(rs)))
        for tag, reach in (("95", reach95), ("99", reach99)):
            got = [x for x in reach if x is not None]
            rows.append(plain_row(ds, m, f"evals_to_{tag}pct", statistics.median(got)
                                  if got else float("nan"), len(got)))
        table.append((m, float(np.mean(vals)), float(np.mean(pct)), reach95, reach99))

    # ---- holdout -------------------------------------------------------------------------
    hs = f"{name}/test"
    hold = []
    for m in ("ppo", "ppo-greedy", "optuna", "random"):
        for i, r in enumerate(results[m]):
            c_def = compare(ev, r.best_config, default, "test", seed=i)
            c_grid = compare(ev, r.best_config, grid.best_config, "test", seed=i)
            rep = ev.evaluate(r.best_config, "test")
            hold.append((m, seeds[i], r.best_config, c_def, c_grid, rep))
            rows.append({"dataset": hs, "system": f"{m}/seed{seeds[i]}",
                         "metric": "reward_minus_default", "value": c_def.diff,
                         "ci_low": c_def.ci_low, "ci_high": c_def.ci_high, "n": c_def.n})
            rows.append({"dataset": hs, "system": f"{m}/seed{seeds[i]}",
                         "metric": "reward_minus_grid_best", "value": c_grid.diff,
                         "ci_low": c_grid.ci_low, "ci_high": c_grid.ci_high, "n": c_grid.n})
            rows.append(plain_row(hs, f"{m}/seed{seeds[i]}", "gates_passed",
                                  float(rep.gates["passed"]), rep.n))
    grid_test = ev.evaluate(grid.best_config, "test")
    def_test = ev.evaluate(default, "test")
    rows += [plain_row(hs, "grid-best", "reward", grid_test.reward, grid_test.n),
             plain_row(hs, "static-default", "reward", def_test.reward, def_test.n),
             plain_row(hs, "grid-best", "gates_passed", float(grid_test.gates["passed"]),
                       grid_test.n)]
    rows += [plain_row(ds, "env", "warm_step_ms_p50", float(np.median(warm)), len(warm)),
             plain_row(ds, "env", "warm_step_ms_p95", float(np.percentile(warm, 95)), len(warm)),
             plain_row(ds, "env", "cold_step_ms", cold_ms, env_cold),
             plain_row(ds, "grid", "wall_s", grid_wall, G),
             plain_row(ds, "ppo", "wall_s", float(np.mean(ppo_wall)), len(ppo_wall))]

    md_adaptive: list = []
    run_adaptive(ev, list(grid.extra["configs"].values()), name, rows, md_adaptive)

    # ---- plots -----------------------------------------------------------------------------
    q = policy.reward_weights
    grid_reps = []
    for cfg in grid.extra["configs"].values():
        rep = ev.evaluate(cfg)
        grid_reps.append({"quality": q.alpha * rep.faithfulness + q.beta * rep.relevancy,
                          "p95_latency_ms": rep.p95_latency_ms, "cost": rep.cost})

    def mark(cfg):
        rep = ev.evaluate(cfg)
        return {"quality": q.alpha * rep.faithfulness + q.beta * rep.relevancy,
                "p95_latency_ms": rep.p95_latency_ms, "cost": rep.cost}

    marked = {"static default": mark(default), "grid best": mark(grid.best_config),
              "PPO (seed 0)": mark(results["ppo"][0].best_config),
              "Optuna (seed 0)": mark(results["optuna"][0].best_config)}
    stem = "tuning.quick" if name == "synthetic" else "tuning"
    for key in ("p95_latency_ms", "cost"):
        plot_pareto(grid_reps, marked, RESULTS / f"{stem}-{name}-pareto-{key}.png", key,
                    f"{name} (valid): quality vs {key}")
    plot_curves(curves, best_valid, RESULTS / f"{stem}-{name}-curves.png",
                f"{name}: incumbent reward vs evaluations")

    # ---- markdown ------------------------------------------------------------------------
    md.append(f"\n## {name}\n\nSplits {split_n}; grid of {G} configs (ceiling, valid reward "
              f"{best_valid:.4f}, config `{grid.best_config.config_hash}`: "
              f"{_short(grid.best_config)}); static default valid reward "
              f"{rewards.get(default.config_hash, ev.evaluate(default).reward):.4f}. "
              f"Budget per method: {budget} evaluations ({budget / G:.0%} of the grid), "
              f"seeds {seeds}.\n")
    md.append("| method | valid reward (mean) | % of grid best | evals to 95% | evals to 99% |")
    md.append("|---|---|---|---|---|")
    for m, v, pct, r95, r99 in table:
        md.append(f"| {m} | {v:.4f} | {pct:.1%} | {_fmt(r95)} | {_fmt(r99)} |")
    md.append(f"\nHoldout (test, n={grid_test.n}): static default {def_test.reward:.4f}, "
              f"grid best {grid_test.reward:.4f} (gates {'pass' if grid_test.gates['passed'] else 'FAIL'}).\n")
    md.append("| method/seed | config | test reward | Δ vs default [95% CI] | Δ/|default| "
              "| Δ vs grid best [95% CI] | % of grid best | gates |")
    md.append("|---|---|---|---|---|---|---|---|")
    for m, s, cfg, cd, cg, rep in hold:
        pct = rep.reward / grid_test.reward if grid_test.reward > 0 else float("nan")
        md.append(f"| {m}/{s} | {_short(cfg)} | {rep.reward:.4f} | {cd.diff:+.4f} "
                  f"[{cd.ci_low:+.4f}, {cd.ci_high:+.4f}] | {cd.relative:+.1%} | "
                  f"{cg.diff:+.4f} [{cg.ci_low:+.4f}, {cg.ci_high:+.4f}] | {pct:.1%} | "
                  f"{'pass' if rep.gates['passed'] else 'FAIL: ' + ','.join(k for k, v in rep.gates.items() if not v)} |")
    md.append(f"\nStep time: warm p50 {np.median(warm):.2f} ms / p95 "
              f"{np.percentile(warm, 95):.2f} ms (batch {min(policy.episode.batch_size, split_n['valid'])}); "
              f"cold step (a new config: its table over all {env_cold} valid queries, retrieval "
              f"memo warm{'; WAS CACHED' if cold_cached else ''}) {cold_ms:.0f} ms; grid {grid_wall:.0f} s; PPO {np.mean(ppo_wall):.0f} s per run "
              f"(incl. Ray/RLlib build).")
    md.extend(md_adaptive)


def run_adaptive(ev: TunerEvaluator, configs, name: str, rows: list, md: list,
                 m: int = 6) -> None:
    """Per-query policy over the m best static configs vs the best static config (holdout)."""
    from rl.adaptive import AdaptivePolicy, QueryBandit, QueryFeatures, top_arms
    from rl.stats import paired_bootstrap

    arms = top_arms(ev, configs, m)
    feats = QueryFeatures(ev)
    train = QueryBandit.build(ev, arms, ev.slice.tune_split, feats)
    test = QueryBandit.build(ev, arms, ev.slice.holdout_split, feats)
    t0 = time.perf_counter()
    pol = AdaptivePolicy(train, seed=0)
    pol.fit(iterations=30)
    fit_s = time.perf_counter() - t0
    P = pol.probabilities(test.X)
    acts = P.argmax(axis=1)
    pol.stop()
    n = len(test.X)
    chosen = test.R[np.arange(n), acts]
    static = test.R[:, 0]  # arm 0 = the best static config on the tuning split
    bs = paired_bootstrap(static, chosen, n_resamples=10_000, seed=0)
    oracle = test.R.max(axis=1).mean()
    hs = f"{name}/test"
    rows.append({"dataset": hs, "system": "adaptive-ppo", "metric": "per_query_reward_minus_static",
                 "value": bs.mean_diff, "ci_low": bs.ci_low, "ci_high": bs.ci_high, "n": n})
    rows += [plain_row(hs, "adaptive-ppo", "per_query_reward", float(chosen.mean()), n),
             plain_row(hs, "best-static-arm", "per_query_reward", float(static.mean()), n),
             plain_row(hs, "per-query-oracle", "per_query_reward", float(oracle), n),
             plain_row(hs, "adaptive-ppo", "mean_max_propensity", float(P.max(axis=1).mean()),
                       n),
             plain_row(hs, "adaptive-ppo", "fit_s", fit_s, 30)]
    share = np.bincount(acts, minlength=len(arms)) / n
    md.append(f"\nAdaptive per-query policy (PPO contextual bandit over the {len(arms)} best "
              f"static configs, features: category, length, retriever scores/agreement): "
              f"holdout per-query reward {chosen.mean():.4f} vs best static {static.mean():.4f}: "
              f"Δ {bs.mean_diff:+.4f} [{bs.ci_low:+.4f}, {bs.ci_high:+.4f}] (paired bootstrap); "
              f"per-query oracle {oracle:.4f}; arm shares {np.round(share, 2).tolist()}; "
              f"mean max propensity {P.max(axis=1).mean():.2f}; fit {fit_s:.0f} s.")


def _seed_row(ds, system, metric, vals):
    v = np.asarray(vals, dtype=float)
    return {"dataset": ds, "system": system, "metric": metric, "value": float(np.mean(v)),
            "ci_low": float(v.min()), "ci_high": float(v.max()), "n": int(v.size)}


def _short(c) -> str:
    s = f"{c.variant} k={c.k} rerank={c.rerank}"
    if c.variant == "hybrid":
        s += f" w={c.fusion_weight:g}"
    return s + f" {c.prompt_id}"


def _fmt(xs) -> str:
    got = [x for x in xs if x is not None]
    miss = len(xs) - len(got)
    s = "/".join(str(x) for x in got) if got else "—"
    return s + (f" ({miss} never)" if miss else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-frac", type=float, default=0.2)
    args = ap.parse_args()
    configure_runtime_env()

    if args.quick:
        names, policy, seeds = ["synthetic"], quick_policy(), [0]
    else:
        names, policy, seeds = args.datasets.split(","), PolicyConfig.defaults(), list(
            range(args.seeds))
    rows: list = []
    md: list = ["Reward r = αF + βR − γ·min(p95/T,2) − δ·min(cost/C_ref,2) − λ·P "
                "(configs/rl/policy.defaults.yaml; F/R per dataset: HotpotQA/MTRAG F = lexical "
                "answer support, R = answer F1; SciFact F = recall@k, R = nDCG@10). "
                "One evaluation = one config on one batch of the valid split."]
    t0 = time.perf_counter()
    for name in names:
        run_dataset(name, policy, seeds, rows, md, args.budget_frac)
    datasets = {n: data_root() / DATA_FILES[n] for n in names if n in DATA_FILES}
    meta = make_meta(0, datasets, {"quick": args.quick, "seeds": seeds,
                                   "budget_frac": args.budget_frac,
                                   "wall_s": time.perf_counter() - t0,
                                   "policy": policy.model_dump(mode="json", by_alias=True)})
    write_results("tuning", rows, meta, "RL tuning: PPO vs static configs and baselines",
                  "\n".join(md))


if __name__ == "__main__":
    main()
