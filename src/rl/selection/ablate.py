"""The whole comparison in one call: `run(cfg, sizes)` -> rows + info, used by
`python bench/selection.py` and `ragpilot select ablate`.

Systems (same passage budget B = `env.max_steps` for all):
    rerank       retrieve-then-rerank: the top B of the candidate list in the reranker's order
    mmr@λ        MMR re-selection of B passages (relevance = cosine, λ in {0.2, 0.4, 0.6, 0.8})
    bc           behaviour cloning of the expert selections
    bc_raft      BC then RAFT rounds
    bc_raft_ppo  BC + RAFT then RLlib PPO (skipped when `ppo.enabled` is false or ppo_iterations=0)
Training uses the train split, model selection (early stopping, best RAFT round) the valid
split; every reported number is on the test split (the holdout).

Where it runs (`runner`, rl.selection.runner): pools are built by the caller (the driver, from
memoised retrieval); training + evaluation are stage functions submitted to the runner:
    bc_stage     BC of the main config (one task)
    main_stage   RAFT (-> PPO) from that BC net, then the systems on test (one task)
    arm_stage    one ablation arm: its baseline and BC+RAFT on test (one task per arm)
`RayRunner` makes each a Ray task (num_cpus=1; arms that reuse the main BC net wait for it; the
main RAFT/PPO and the arms run side by side); `LocalRunner` (the default here) calls them in
order in this process. Seeds are the config's, per stage, so both give the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag.fusion import mmr_select
from rl.selection.bc import train_bc
from rl.selection.config import SelectionConfig
from rl.selection.data import SelectionData, cross_encoder_status
from rl.selection.features import Pool
from rl.selection.policy import SelectionNet, rollout
from rl.selection.raft import train_raft
from rl.selection.rewards import SelectionReward, selection_metrics
from rl.selection.runner import LocalRunner
from rl.stats.bootstrap import paired_bootstrap

LAMBDAS = (0.2, 0.4, 0.6, 0.8)
KS = (20, 50, 100)


@dataclass
class Sizes:
    """Queries per split (None = all) and what to run."""

    train: int | None = None
    valid: int | None = None
    test: int | None = None
    ks: tuple[int, ...] = KS
    lambdas: tuple[float, ...] = LAMBDAS
    ppo_iterations: int | None = None
    raft_rounds_ablation: int = 1
    faithfulness: bool = True


@dataclass
class SystemResult:
    rows: list[dict[str, float]]
    ms: list[float] = field(default_factory=list)


def rerank_selection(pool: Pool, budget: int) -> list[int]:
    return pool.rerank_order[:budget]


def mmr_selection(pool: Pool, budget: int, lam: float) -> list[int]:
    ids = [str(i) for i in range(pool.n)]
    return [int(i) for i in mmr_select(pool.qemb, ids, pool.emb, pool.rel.tolist(), budget,
                                       lam)]


def evaluate(pools: Sequence[Pool], select: Callable[[Pool], list[int]],
             reward: SelectionReward, faithfulness: bool = False) -> SystemResult:
    rows, ms = [], []
    for p in pools:
        t0 = time.perf_counter()
        sel = select(p)
        ms.append((time.perf_counter() - t0) * 1000.0)
        rows.append(selection_metrics(reward, p, sel, with_faithfulness=faithfulness))
    return SystemResult(rows, ms)


def policy_selector(net: SelectionNet, k: int, budget: int) -> Callable[[Pool], list[int]]:
    return lambda p: rollout(net, p, k, budget).selected


def _vals(res: SystemResult, metric: str) -> np.ndarray:
    return np.array([r.get(metric, np.nan) for r in res.rows], dtype=np.float64)


def metric_rows(dataset: str, system: str, res: SystemResult, metrics: Sequence[str],
                seed: int = 0) -> list[dict[str, Any]]:
    from rl.stats.bootstrap import bootstrap_mean_ci

    out = []
    for m in metrics:
        v = _vals(res, m)
        v = v[~np.isnan(v)]
        if v.size == 0:
            continue
        b = bootstrap_mean_ci(v, seed=seed) if v.size > 1 else None
        out.append({"dataset": dataset, "system": system, "metric": m,
                    "value": float(v.mean()), "ci_low": b.ci_low if b else None,
                    "ci_high": b.ci_high if b else None, "n": int(v.size)})
    if res.ms:
        out.append({"dataset": dataset, "system": system, "metric": "selection_ms_p50",
                    "value": float(np.median(res.ms)), "ci_low": None, "ci_high": None,
                    "n": len(res.ms)})
    return out


def paired_rows(dataset: str, base: str, cand: str, a: SystemResult, b: SystemResult,
                metrics: Sequence[str], seed: int = 0) -> list[dict[str, Any]]:
    """`<cand> - <base>` paired bootstrap 95% CI per metric (pairs where both are defined)."""
    out = []
    for m in metrics:
        va, vb = _vals(a, m), _vals(b, m)
        ok = ~(np.isnan(va) | np.isnan(vb))
        if ok.sum() < 2:
            continue
        r = paired_bootstrap(va[ok], vb[ok], seed=seed)
        out.append({"dataset": dataset, "system": f"{cand} - {base}", "metric": f"delta_{m}",
                    "value": r.mean_diff, "ci_low": r.ci_low, "ci_high": r.ci_high,
                    "n": r.n, "p_value": r.p_value})
    return out


def bc_stage(cfg: SelectionConfig, train: Sequence[Pool], valid: Sequence[Pool],
             reward: SelectionReward) -> tuple[SelectionNet, dict[str, Any]]:
    """BC on `train` (early stopping on `valid`): the net and its info (no loss history)."""
    t0 = time.perf_counter()
    net, bc_info = train_bc(train, reward, cfg.bc, cfg.env.k, cfg.env.max_steps, cfg.seed,
                            val_pools=valid)
    info = {k: v for k, v in bc_info.items() if k != "history"}
    info["seconds"] = time.perf_counter() - t0
    return net, info


def train_stack(cfg: SelectionConfig, train: Sequence[Pool], valid: Sequence[Pool],
                reward: SelectionReward, ppo_iterations: int | None = None,
                raft_rounds: int | None = None, bc_net: SelectionNet | None = None
                ) -> tuple[dict[str, SelectionNet], dict[str, Any]]:
    """BC -> RAFT (-> PPO): the nets by system name and the training info."""
    e = cfg.env
    info: dict[str, Any] = {}
    if bc_net is None:
        bc_net, info["bc"] = bc_stage(cfg, train, valid, reward)
    nets = {"bc": bc_net}
    raft_cfg = cfg.raft if raft_rounds is None else cfg.raft.model_copy(
        update={"rounds": raft_rounds})
    t0 = time.perf_counter()
    nets["bc_raft"], info["raft"] = train_raft(bc_net, train, reward, raft_cfg, e.k, e.max_steps,
                                               batch_size=cfg.bc.batch_size, seed=cfg.seed,
                                               val_pools=valid)
    info["raft"]["seconds"] = time.perf_counter() - t0
    iters = cfg.ppo.iterations if ppo_iterations is None else ppo_iterations
    if cfg.ppo.enabled and iters > 0:
        from rl.selection.ppo import SelectionPPO, warm_value

        t0 = time.perf_counter()
        import copy

        init = copy.deepcopy(nets["bc_raft"])
        info["ppo_value_warm_mse"] = warm_value(init, train, reward, e.k, e.max_steps,
                                                seed=cfg.seed)
        ppo = SelectionPPO(cfg, train, reward, init=init)
        try:
            nets["bc_raft_ppo"], info["ppo"] = ppo.train(iters)
        finally:
            ppo.stop()
        info["ppo"]["seconds"] = time.perf_counter() - t0
    return nets, info


def main_stage(cfg: SelectionConfig, train: Sequence[Pool], valid: Sequence[Pool],
               test: Sequence[Pool], reward: SelectionReward, bc_net: SelectionNet,
               bc_info: dict[str, Any], ppo_iterations: int | None, faithfulness: bool
               ) -> tuple[dict[str, SystemResult], dict[str, Any]]:
    """RAFT (-> PPO) from the BC net, then every trained system on `test`: (results by system,
    training info)."""
    nets, info = train_stack(cfg, train, valid, reward, ppo_iterations, bc_net=bc_net)
    B = cfg.env.max_steps
    res = {name: evaluate(test, policy_selector(net, cfg.env.k, B), reward, faithfulness)
           for name, net in nets.items()}
    return res, {"bc": bc_info, **info}


@dataclass(frozen=True)
class Arm:
    """One ablation arm: `label` (e.g. "k=50"), its config, and the rule-based baseline it
    reports next to BC+RAFT ("mmr" with `mmr_lambda`, "rerank", or None)."""

    label: str
    cfg: SelectionConfig
    baseline: str | None = None
    mmr_lambda: float = 0.0


def arm_stage(arm: Arm, train: Sequence[Pool], valid: Sequence[Pool], test: Sequence[Pool],
              reward: SelectionReward, bc_net: SelectionNet | None, rounds: int
              ) -> list[tuple[str, SystemResult]]:
    """The arm's baseline, then BC+RAFT trained with the arm's config (from `bc_net` when it is
    the main BC net, else BC from scratch), on `test`; scored with the main `reward`."""
    c, B = arm.cfg, arm.cfg.env.max_steps
    out: list[tuple[str, SystemResult]] = []
    if arm.baseline == "mmr":
        out.append((f"{arm.label} mmr",
                    evaluate(test, lambda p: mmr_selection(p, B, arm.mmr_lambda), reward)))
    elif arm.baseline == "rerank":
        out.append((f"{arm.label} rerank", evaluate(test, lambda p: rerank_selection(p, B),
                                                    reward)))
    rw = reward if c.reward == reward.cfg else SelectionReward(
        c.reward, reader=reward.reader, reward_model=reward.reward_model,
        load_reward_model=False)
    nets, _ = train_stack(c, train, valid, rw, 0, rounds, bc_net=bc_net)
    out.append((f"{arm.label} bc_raft",
                evaluate(test, policy_selector(nets["bc_raft"], c.env.k, B), reward)))
    return out


HOTPOT_METRICS = ("support_f1", "support_prec", "support_recall", "answer_f1", "answer_em",
                  "redundancy", "max_pair_cosine", "n_passages")
MTRAG_METRICS = ("answer_f1", "faithfulness", "support_f1", "support_recall", "redundancy",
                 "n_passages")
ABLATION_METRICS = ("support_f1", "answer_f1", "redundancy", "n_passages")


def run_dataset(name: str, cfg: SelectionConfig, sizes: Sizes, log=print,
                ablations: bool = True, runner=None, data: SelectionData | None = None
                ) -> tuple[list[dict], dict]:
    """Main comparison (+ ablations for HotpotQA) on one dataset. `runner`: where training
    runs (module docstring; default in-process). `data`: the dataset's pool builder (default
    `SelectionData(name, cfg)`)."""
    runner = runner or LocalRunner()
    rows: list[dict] = []
    info: dict[str, Any] = {"runner": runner.describe()}
    faith = sizes.faithfulness and name == "mtrag"
    metrics = MTRAG_METRICS if name == "mtrag" else HOTPOT_METRICS
    data = data or SelectionData(name, cfg)
    t0 = time.perf_counter()
    train, valid, test = (data.pools(s, n) for s, n in (("train", sizes.train),
                                                        ("valid", sizes.valid),
                                                        ("test", sizes.test)))
    info["pool_build_ms_p50"] = float(np.median(data.build_ms))
    info["pools_seconds"] = time.perf_counter() - t0
    info["n"] = {"train": len(train), "valid": len(valid), "test": len(test)}
    log(f"[{name}] pools {info['n']} in {info['pools_seconds']:.0f} s")
    reward = SelectionReward(cfg.reward)
    info["reward_model_used"] = reward.has_reward_model and cfg.reward.reward_model > 0
    B = cfg.env.max_steps
    refs = tuple(runner.put(x) for x in (train, valid, test, reward))
    bc_ref, bc_info_ref = runner.submit(bc_stage, cfg, *refs[:2], refs[3], num_returns=2)
    main_ref = runner.submit(main_stage, cfg, *refs, bc_ref, bc_info_ref, sizes.ppo_iterations,
                             faith)
    pending = None
    if ablations:
        pending = submit_ablations(cfg, data, refs, bc_ref, sizes, runner,
                                   lambda m: log(f"[{name}] {m}"),
                                   info.setdefault("ablation_notes", {}))
    res = {"rerank": evaluate(test, lambda p: rerank_selection(p, B), reward, faith)}
    trained, info["training"] = runner.get(main_ref)
    res.update(trained)
    log(f"[{name}] trained {sorted(trained)}")
    for sys_name, r in res.items():
        rows += metric_rows(name, sys_name, r, metrics)
    for cand in trained:
        rows += paired_rows(name, "rerank", cand, res["rerank"], res[cand], metrics)
    if name == "mtrag":
        other = "last_turn" if cfg.mtrag.rewrite != "last_turn" else "concat"
        alt = SelectionData(name, cfg.replace(**{"mtrag.rewrite": other}), data=data.data)
        alt_test = alt.pools("test", sizes.test)
        r = evaluate(alt_test, lambda p: rerank_selection(p, B), reward, False)
        rows += metric_rows(name, f"rerank [rewrite={other}]", r, ("support_recall",
                                                                    "answer_f1"))
        rows += metric_rows(name, f"rerank [rewrite={cfg.mtrag.rewrite}]", res["rerank"],
                            ("support_recall",))
    if pending is not None:
        rows += gather_ablations(name, pending, runner, log)
    return rows, info


def submit_ablations(cfg: SelectionConfig, data: SelectionData, refs, bc_net, sizes: Sizes,
                     runner, log, notes: dict[str, str]) -> list[tuple[Arm, Any]]:
    """Build each arm's own pools (here, in the driver) and submit its `arm_stage`:
    [(arm, result ref)] in table order. `refs`: the runner refs of the main train, valid and
    test pools and of the reward; `bc_net`: the main BC net or its ref. An arm that cannot run
    is recorded in `notes` instead (see ablation_rows)."""
    tr_ref, va_ref, te_ref, rw_ref = refs
    rounds = sizes.raft_rounds_ablation
    arms: list[tuple[Arm, Any]] = []

    def submit(arm: Arm, tr, va, te, bc) -> None:
        arms.append((arm, runner.submit(arm_stage, arm, tr, va, te, rw_ref, bc, rounds)))

    def own_pools(c: SelectionConfig):
        return tuple(runner.put(data.pools(s, n, c)) for s, n in (
            ("train", sizes.train), ("valid", sizes.valid), ("test", sizes.test)))

    # MMR lambda: as a selection rule, and as the shaping lambda of BC+RAFT
    for lam in sizes.lambdas:
        c = cfg.replace(**{"reward.mmr_lambda": lam, "reward.shaping": "stepwise"})
        submit(Arm(f"mmr_lambda={lam}", c, "mmr", lam), tr_ref, va_ref, te_ref, bc_net)
    # shaping: final-only vs step-wise
    for shaping in ("final_only", "stepwise"):
        c = cfg.replace(**{"reward.shaping": shaping})
        submit(Arm(f"shaping={shaping}", c), tr_ref, va_ref, te_ref, bc_net)
    # reranker: none / cosine / the trained cross-encoder `env.reranker_model` (when registered;
    # otherwise the arm is reported as not run, with the reason, in `notes`)
    ce_model, why = cross_encoder_status(cfg.env.reranker_model)
    for rr in ("none", "cosine", "cross_encoder"):
        if rr == "cross_encoder" and ce_model is None:
            notes["reranker=cross_encoder"] = why
            log(f"ablation: reranker=cross_encoder {why}")
            continue
        c = cfg.replace(**{"env.reranker": rr})
        if rr == cfg.env.reranker:
            submit(Arm(f"reranker={rr}", c, "rerank"), tr_ref, va_ref, te_ref, bc_net)
        else:
            submit(Arm(f"reranker={rr}", c, "rerank"), *own_pools(c), None)
    # K: candidate set size
    for k in sizes.ks:
        c = cfg.replace(**{"env.k": k})
        if k == cfg.env.k:
            submit(Arm(f"k={k}", c, "rerank"), tr_ref, va_ref, te_ref, bc_net)
        else:
            submit(Arm(f"k={k}", c, "rerank"), *own_pools(c), None)
    return arms


def gather_ablations(name: str, arms: list[tuple[Arm, Any]], runner, log) -> list[dict]:
    """Rows `ablation:<arm> <system>` of the submitted arms, in table order."""
    rows: list[dict] = []
    for arm, ref in arms:
        for label, r in runner.get(ref):
            rows.extend(metric_rows(name, f"ablation:{label}", r, ABLATION_METRICS))
        log(f"[{name}] ablation: {arm.label} done")
    return rows


def ablation_rows(name: str, cfg: SelectionConfig, data: SelectionData, train, valid, test,
                  reward: SelectionReward, bc_net: SelectionNet, sizes: Sizes, log,
                  notes: dict[str, str] | None = None, runner=None) -> list[dict]:
    """Rows with system names `ablation:<what>=<value> <system>` (test split, same budget).
    An arm that cannot run is never skipped silently: `notes[<what>=<value>]` says why (e.g.
    "not run: no cross-encoder registered ...") and the log says it too."""
    notes = {} if notes is None else notes
    runner = runner or LocalRunner()
    refs = tuple(runner.put(x) for x in (train, valid, test, reward))
    arms = submit_ablations(cfg, data, refs, runner.put(bc_net), sizes, runner,
                            lambda m: log(f"[{name}] {m}"), notes)
    return gather_ablations(name, arms, runner, log)
