"""The `ppo-policy` system of `bench/policy.py`: issue 19's per-query PPO policy
(`rl.routing.ppo_policy.PerQueryPPO`) trained per seed on the train split, its checkpoint chosen
on valid (greedy, realised reward among checkpoints within the cost budget), then served
greedily on test once.

Budget of the PPO-Lagrangian constraint: best-static's mean tokens on valid (in C_ref units).
Its test outcomes come from the lazy evaluator on the configs it picks (most are outside the
portfolio: that is honest, the rows are the same per-query reward); the oracle stays the
portfolio's per-query oracle.

Seeds: the per-query test reward / quality / tokens are averaged over the seeds, and the rows'
CIs are paired bootstraps over test queries of that seed-averaged per-query value (the
seed-to-seed spread is in `details[ds]["ppo"]["per_seed"]`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rl.kernel.space import is_conversational
from rl.routing.heads import HeadLayout
from rl.routing.ppo_policy import PerQueryPPO
from rl.routing.selection import better_on_valid
from rl.routing.settings import PPOPolicySettings
from rl.routing.warm_start import WarmStart
from rl.routing.worlds import ConcatWorld, EvaluatorWorld

SYSTEM = "ppo-policy"


Segment = tuple[str, np.ndarray]
"""(split name, query indices into that split)."""
Part = Segment | list[Segment]
"""A role's queries (train / valid / test): one split's, or several splits' (a cross-fitted
fold, `bench.policy.crossfit_parts`), in this order."""


def segments(part: Part) -> list[Segment]:
    return list(part) if isinstance(part, list) else [part]


def world_of(ev, part: Part) -> EvaluatorWorld | ConcatWorld:
    """The query world of a role: the evaluator's rows of its queries, in `part`'s order."""
    segs = segments(part)
    if len(segs) == 1:
        return EvaluatorWorld(ev, *segs[0])
    return ConcatWorld([EvaluatorWorld(ev, s, idx) for s, idx in segs])


def with_train(settings: PPOPolicySettings, **train: Any) -> PPOPolicySettings:
    """`settings` with some `train` fields replaced (`PPOPolicySettings.with_train`)."""
    return settings.with_train(**train)


def with_heads(settings: PPOPolicySettings, **heads: Any) -> PPOPolicySettings:
    """`settings` with some `heads` fields replaced (`PPOPolicySettings.with_heads`)."""
    return settings.with_heads(**heads)


def run_ppo(ev, parts: dict[str, Part], X: dict[str, np.ndarray],
            budget_tokens: float, settings: PPOPolicySettings, seeds: list[int],
            out_dir: Path | None = None, deadline: float | None = None,
            warm: Sequence[WarmStart] = (), grid: Sequence[dict[str, Any]] = ({},),
            system: str = SYSTEM, keep: list[PerQueryPPO] | None = None,
            base: dict[str, list[RAGConfig]] | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Train one policy per seed, act on test. Returns the seed-averaged per-query test arrays
    {"R", "Q", "T"} and the details (per seed: valid choice, test means, wall time).
    `warm`: behaviour-cloning starts (the best on valid is where PPO starts, and it is a model
    selection candidate); `grid`: `train` overrides (e.g. lr, entropy_coeff) tried on the
    first seed, the run whose chosen checkpoint is best on valid (`better_on_valid`) is kept
    and its overrides are used for every later seed (valid only: test never chooses).
    `deadline` (epoch seconds): no new seed starts after it (at least one always runs); the
    seeds left out are listed in the details as `seeds_not_run`. `keep`: a list the chosen
    policy of each seed run is appended to (in seed order), to act on other queries.
    `base`: per role the base policy's config per query (a residual policy: settings with
    the `defer` head); the details then count the test queries each seed defers."""
    examples = [e for part in parts.values() for s, _ in segments(part)
                for e in ev.data.examples(s)]
    layout = HeadLayout(settings.heads, ev.policy, is_conversational(examples))
    worlds = {role: world_of(ev, part) for role, part in parts.items()}
    budget = budget_tokens / worlds["train"].cost_ref
    cap = budget * (1 + settings.lagrange.slack)
    per_seed, arrays = [], {"R": [], "Q": [], "T": []}
    skipped: list[int] = []
    chosen: dict[str, Any] = {}
    for seed in seeds:
        if per_seed and deadline is not None and time.time() > deadline:
            skipped.append(seed)
            continue
        t0 = time.perf_counter()
        pol, hist, hp, tried = None, [], {}, []
        for g in (grid if not per_seed else [chosen]):
            cand = PerQueryPPO.create(layout, with_train(settings, **g), X["train"])
            h = cand.train(worlds["train"], X["train"], worlds["valid"], X["valid"], budget,
                           seed=seed, checkpoint_dir=None if out_dir is None
                           else out_dir / f"seed{seed}" / _tag(g),
                           log=lambda m, s=seed, t=_tag(g): print(
                               f"    [{ev.data.name} {system} seed {s} {t}] {m}", flush=True),
                           warm=warm, base_train=None if base is None else base["train"],
                           base_valid=None if base is None else base["valid"])
            tried.append({**g, "best": cand.meta["best"]})
            if pol is None or better_on_valid(cand.meta["best"], pol.meta["best"], cap):
                pol, hist, hp = cand, h, g
        chosen = hp
        train_s = time.perf_counter() - t0
        cfgs = pol.act(X["test"], None if base is None else base["test"])
        outs = worlds["test"].outcomes(cfgs)
        R = np.array([o.reward for o in outs])
        Q = np.array([o.quality for o in outs])
        T = np.array([o.cost for o in outs]) * worlds["test"].cost_ref
        for k, v in (("R", R), ("Q", Q), ("T", T)):
            arrays[k].append(v)
        if out_dir is not None:
            pol.save(out_dir / f"seed{seed}" / "policy")
        if keep is not None:
            keep.append(pol)
        used = {}
        for c in cfgs:
            used[c.config_hash] = used.get(c.config_hash, 0) + 1
        per_seed.append({
            "seed": seed, "best": pol.meta["best"], "lambda_final": pol.lam,
            "warm_start": pol.meta.get("warm_start"), "hp": hp, "grid": tried,
            "test_reward": float(R.mean()), "test_quality": float(Q.mean()),
            "test_tokens": float(T.mean()), "distinct_test_configs": len(used),
            "test_deferred": float(pol.deferred(X["test"]).mean()),
            "train_s": round(train_s, 1), "wall_s": round(time.perf_counter() - t0, 1),
            "history": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in h.items()}
                        for h in hist]})
        print(f"  [{ev.data.name}] {system} seed {seed}: test reward {R.mean():.4f} "
              f"tokens {T.mean():.0f} ({per_seed[-1]['wall_s']}s)", flush=True)
    mean = {k: np.mean(np.vstack(v), axis=0) for k, v in arrays.items()}
    details = {"seeds": [p["seed"] for p in per_seed], "seeds_not_run": skipped,
               "budget_tokens": budget_tokens, "warm_starts": [w.name for w in warm],
               "grid": list(grid),
               "heads": list(layout.names), "gates": layout.gates_spec(),
               "iters": settings.train.iters, "batch": settings.train.batch,
               "per_seed": per_seed,
               "seed_mean_test_reward": float(np.mean([p["test_reward"] for p in per_seed])),
               "seed_sd_test_reward": float(np.std([p["test_reward"] for p in per_seed]))}
    return mean, details


def _tag(g: dict[str, Any]) -> str:
    return "-".join(f"{k}{v}" for k, v in sorted(g.items())) or "default"
