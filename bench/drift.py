"""Drift benchmark (issue 19 item 6): query streams whose mix, price or corpus shifts, and how
much regret each way of configuring RAG pays against the best static config of each phase.

    python bench/drift.py                  # full: HotpotQA, MTRAG and the synthetic world
    python bench/drift.py --quick          # < 2 min: the synthetic world only

Arms: the 30-config portfolio of `bench/headroom.py` (on MTRAG, conversational, also each arm
with the other query formulations, and formulation feature views: `drift_data.drift_arms`,
bench/policy.py's design; 84 arms), every arm evaluated on every query of
train, valid and test through the tuner's per-query tables (`bench.headroom.matrices`: reward
= `per_query_reward`, cached rows). Streams (`streams`; two phases of `--length` queries,
drawn from the test split only, see `bench/drift_streams.py`):
  * `hotpotqa-type-shift`: bridge/comparison 90/10 -> 10/90 (the dataset's type label);
  * `mtrag-domain-shift`: domain A -> domain B, the ordered pair whose valid-best config of A
    loses the most on B's valid queries (chosen on valid, never on test);
  * `mtrag-turn-shift`: early turns (1-2) -> late turns (5 and later);
  * `hotpotqa-price-shift`: the same mix throughout, the token price (the reward's cost weight
    δ) doubles in phase 2: phase-2 rewards are recomputed from the stored per-query F, R,
    latency and tokens with `RewardSpec` (δ doubled);
  * `hotpotqa-price-drop`: the same, the price cut in phase 2 by the mildest factor of
    `PRICE_DROPS` that changes the valid split's best static config (chosen on valid; added
    after the doubled price was found not to move the best config);
  * `synthetic-corpus-update`: phase 2 asks questions about a regenerated world (new seed,
    twice the people and companies: `UPDATE_WORLD`), its rows computed by the evaluator on the
    new corpus, latency priced by the old world's cost model (only the corpus changes).
`--quick`: `synthetic-type-shift`, `synthetic-price-shift`, `synthetic-corpus-update`.
Synthetic has no train split: train and valid are the two halves of its valid split (seeded).

Systems: `bench/drift_streams.py` (`frozen-static`, `searcher-per-phase`, `sw-bandit`,
`router-policy`, `router-policy-online`) and `ppo-policy` / `ppo-policy-online`
(`bench/drift_ppo.py`; `--no-ppo` leaves them out). The learned per-query policies never
read test: `router-policy` is the supervised router (`rl.routing.router.select_router_cv`,
chosen by cross-validation over train, `bench/drift_policy.py`), the product's default; `ppo-policy` is issue 19's per-query PPO
policy (`rl.routing.ppo_policy`, trained as in `bench/policy.py`, one policy per seed), frozen:
by default bench/policy.py's residual design, which may defer a query to `router-policy`'s
router held to the budget (`--ppo-base none`: PPO alone); it picks configs outside the
portfolio and is scored by its own picks' rows;
`ppo-policy-online` is that policy updated by PPO on the stream from the rewards of the
configs it served (`rl.routing.ppo_online`).

Rows (per stream = `dataset`, pooled over `--seeds` seeds (stream draws and bandit /
exploration seeds), bootstrap 95% CIs over (seed, query) steps):
  * every system's `regret_phase<p>`: mean per-query regret over phase p (reward units);
  * `frozen-static / router-policy` (and `/ router-policy-online`) `regret_ratio` after each shift
    (phase >= 2): mean regret ratio; null when frozen-static has no regret after the shift
    (`note`: undefined) or only the policy has none (unbounded);
  * `router-policy` and `ppo-policy` `gap_to_phase_best` per phase: the phase-best static's
    mean reward minus the policy's; `frozen-static / ppo-policy` `regret_ratio` as above.
    Pre-registered targets (issue 19, for `ppo-policy`): regret_ratio >= 2, gap <= 0.01.
Plots: `bench/results/drift-<stream>.png` (cumulative regret, mean over seeds, min-max band).
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

from bench import drift_ppo  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    make_meta,
    metric_row,
    write_results,
)
from bench.drift_data import Bundle, load_bundle, load_updated_world, price_matrix  # noqa: E402
from bench.drift_policy import fit_learned_policy  # noqa: E402
from bench.drift_ppo import ONLINE as PPO_ONLINE  # noqa: E402
from bench.drift_ppo import SYSTEM as PPO_SYSTEM  # noqa: E402
from bench.drift_report import TITLE, markdown, plot_stream  # noqa: E402
from bench.drift_streams import (  # noqa: E402
    ONLINE_GRID,
    SH_ETA,
    SH_RUNGS,
    SYSTEMS,
    Calibration,
    OnlineSettings,
    PhaseSpec,
    Pool,
    StreamSpec,
    online_policy,
    phase_best,
    realise,
    regret,
    regret_of_served,
    run_systems,
    static_arm_for_mix,
)
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.portfolio_bandit import SlidingWindowUCB  # noqa: E402
from rl.stats.bootstrap import bootstrap_statistic  # noqa: E402

NAME = "drift"
PRICE_FACTOR = 2.0
PRICE_DROPS = (0.5, 0.25, 0.1)
"""Candidate token-price cuts of the price-drop stream; the mildest that changes the valid
split's best static config is used (`price_drop_on_valid`), so the stream is a shift that
matters, chosen without the test split."""
SW_WINDOW = 150
RATIO_SYSTEMS = ("router-policy", "router-policy-online", PPO_SYSTEM, PPO_ONLINE)
"""Systems with a `frozen-static / <system>` regret_ratio row (those in the run)."""
GAP_SYSTEMS = ("router-policy", PPO_SYSTEM)
"""Systems with `gap_to_phase_best` rows (those in the run)."""
NO_REGRET = 1e-4
"""Mean regret per query (reward units) below which a system counts as not hurt (float sums
of equal rewards are not exactly 0)."""


def mtrag_domain_pair(R: np.ndarray, dom: np.ndarray) -> tuple[str, str]:
    """The ordered pair (A, B) of domains whose valid-best arm of A loses the most reward on
    B's valid queries against B's valid-best arm (`R`, `dom`: the valid split)."""
    best, worst = None, -np.inf
    doms = sorted(set(dom))
    for a in doms:
        arm_a = int(np.argmax(R[dom == a].mean(axis=0)))
        for b in doms:
            if b == a:
                continue
            mb = R[dom == b].mean(axis=0)
            loss = float(mb.max() - mb[arm_a])
            if loss > worst:
                best, worst = (a, b), loss
    return best


def price_pool(factor: float) -> str:
    """The name of the pool whose rewards charge tokens at `factor` times the price."""
    return f"price{factor:g}"


def pool_price(name: str) -> float | None:
    """The price factor of a `price_pool` name, None for another pool."""
    return float(name[len("price"):]) if name.startswith("price") else None


def price_drop_on_valid(bundle: Bundle, tried: list | None = None) -> float | None:
    """The mildest `PRICE_DROPS` factor under which the valid split's best static arm is not
    the one at today's price (None: no candidate changes it). `tried` gets (factor, best arm,
    its valid mean reward) for each factor looked at, today's price first."""
    def best(f: float) -> int:
        m = bundle.R["valid"].mean(axis=0) if f == 1.0 else price_matrix(
            bundle, f, "valid").mean(axis=0)
        j = int(np.argmax(m))
        if tried is not None:
            tried.append((f, bundle.names[j], round(float(m[j]), 4)))
        return j

    now = best(1.0)
    for f in PRICE_DROPS:
        if best(f) != now:
            return f
    return None


def streams(quick: bool, length: int, bundles: dict[str, Bundle],
            skipped: list[dict] | None = None) -> list[tuple[StreamSpec, str]]:
    """(stream, label key of its pools) for the run (module docstring); a stream whose
    valid-split condition fails is left out and said in `skipped` (name, reason)."""
    shift = (PhaseSpec({"bridge": 0.9, "comparison": 0.1}),
             PhaseSpec({"bridge": 0.1, "comparison": 0.9}))
    price = (PhaseSpec({"all": 1.0}), PhaseSpec({"all": 1.0}, price_pool(PRICE_FACTOR)))
    corpus = StreamSpec("synthetic-corpus-update", "synthetic",
                        (PhaseSpec({"all": 1.0}), PhaseSpec({"all": 1.0}, "updated")), length,
                        "phase 2: questions about a regenerated world (new seed, 2x entities)")
    if quick:
        return [(StreamSpec("synthetic-type-shift", "synthetic", shift, length,
                            "bridge/comparison 90/10 -> 10/90"), "type"),
                (StreamSpec("synthetic-price-shift", "synthetic", price, length,
                            f"token price x{PRICE_FACTOR:g} in phase 2"), "all"), (corpus, "all")]
    mt = bundles["mtrag"]
    a, b = mtrag_domain_pair(mt.R["valid"], mt.labels["valid"]["domain"])
    tried: list = []
    drop = price_drop_on_valid(bundles["hotpotqa"], tried)
    if drop is None and skipped is not None:
        skipped.append({"stream": "hotpotqa-price-drop", "reason": (
            "no price cut in " + str(list(PRICE_DROPS)) + " changes the valid split's best "
            "static config (price factor, best arm, its valid mean reward: "
            + "; ".join(f"x{f:g} {n} {m}" for f, n, m in tried) + ")")})
    dropped = [] if drop is None else [(StreamSpec(
        "hotpotqa-price-drop", "hotpotqa",
        (PhaseSpec({"all": 1.0}), PhaseSpec({"all": 1.0}, price_pool(drop))), length,
        f"token price x{drop:g} in phase 2 (the mildest of {list(PRICE_DROPS)} that changes "
        "the valid split's best static config)"), "all")]
    return [
        (StreamSpec("hotpotqa-type-shift", "hotpotqa", shift, length,
                    "bridge/comparison 90/10 -> 10/90"), "type"),
        (StreamSpec("mtrag-domain-shift", "mtrag", (PhaseSpec({a: 1.0}), PhaseSpec({b: 1.0})),
                    length, f"domain {a} -> {b} (the pair chosen on valid)"), "domain"),
        (StreamSpec("mtrag-turn-shift", "mtrag", (PhaseSpec({"early": 1.0}),
                                                  PhaseSpec({"late": 1.0})), length,
                    "turns 1-2 -> turns 5+"), "turn-band"),
        (StreamSpec("hotpotqa-price-shift", "hotpotqa", price, length,
                    f"token price x{PRICE_FACTOR:g} in phase 2"), "all"),
        *dropped,
        (corpus, "all"),
    ]


def make_bandit(n_arms: int, seed: int) -> SlidingWindowUCB:
    """`sw-bandit`'s learner: `rl.routing.portfolio_bandit.SlidingWindowUCB` over `n_arms` arms, window
    `SW_WINDOW`, c 0.5, untried arms drawn with `seed`."""
    return SlidingWindowUCB(n_arms, window=SW_WINDOW, seed=seed)


def _ratio_row(stream: str, system: str, num: np.ndarray, den: np.ndarray, phase: int,
               seed: int) -> dict:
    """mean(num) / mean(den) (frozen-static's regret over the policy's) with a paired
    bootstrap 95% CI. Undefined when frozen-static's regret is <= `NO_REGRET` (the shift did
    not hurt the frozen config: no system can be 2x better than no regret); +inf when only
    the policy's is (it matched or beat the phase's best while the frozen config lost). Both
    are JSON null, said in `note`; undefined resamples are left out of the CI."""
    def ratio(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a <= NO_REGRET, np.nan,
                            np.where(b > NO_REGRET, a / np.where(b > NO_REGRET, b, 1.0), np.inf))

    boot = bootstrap_statistic(lambda idx: ratio(num[idx].mean(axis=1), den[idx].mean(axis=1)),
                               num.size, n_resamples=4000, seed=seed)
    boot = boot[~np.isnan(boot)]
    lo, hi = (np.quantile(boot, [0.025, 0.975], method="inverted_cdf") if boot.size
              else (np.nan, np.nan))
    value = float(ratio(num.mean(), den.mean()))
    note = (f"unbounded: the policy's regret is <= {NO_REGRET:g} while frozen-static's is "
            "larger" if value == np.inf else f"undefined: frozen-static's regret is <= "
            f"{NO_REGRET:g} (the shift did not hurt the frozen config)" if np.isnan(value)
            else "")

    def fin(x):
        return float(x) if np.isfinite(x) else None

    return {"dataset": stream, "system": system, "metric": "regret_ratio", "phase": phase,
            "value": fin(value), "ci_low": fin(lo), "ci_high": fin(hi), "n": int(num.size),
            "policy_regret": float(den.mean()), "frozen_regret": float(num.mean()),
            "note": note}


def run_stream(spec: StreamSpec, key: str, pools: dict[str, Pool], bundle: Bundle, learned,
               bandit_factory, seeds: int, seed0: int, png: Path,
               online: OnlineSettings, adapters: dict[str, Any] | None = None
               ) -> tuple[list[dict], dict]:
    """Rows and details of one stream over `seeds` seeds. `adapters`: system name ->
    f(realised stream, seed index) -> (N,) served rewards, for systems outside the portfolio
    that learn on the stream (`ppo-policy-online`)."""
    valid_labels = bundle.labels["valid"][key]
    static = static_arm_for_mix(bundle.R["valid"], valid_labels, spec.phases[0].mix)
    calib = Calibration.from_valid(bundle.R["valid"], learned.scores(bundle.X["valid"]),
                                   learned.act(bundle.X["valid"]))
    Rt = bundle.R["train"]
    rng_range = (float(Rt.min()), float(Rt.max()))
    adapters = adapters or {}
    extra = sorted(pools["main"].extra) + sorted(adapters)
    systems = SYSTEMS + tuple(extra)
    reg = {s: [] for s in systems}
    phases, picks, best_names = [], {s: [] for s in SYSTEMS}, []
    for i in range(seeds):
        seed = seed0 + i
        real = realise(spec, pools, seed)
        ch = run_systems(real, static, learned.act, learned.scores, bandit_factory, rng_range,
                         seed, online, calib)
        phases.append(real.phase)
        best_names.append([bundle.names[j] for j in phase_best(real.R, real.phase)])
        for s in SYSTEMS:
            reg[s].append(regret(real.R, real.phase, ch[s]))
            picks[s].append(ch[s])
        for s in extra:  # stream seed i is served by the system's copy i mod S
            if s in adapters:
                reg[s].append(regret_of_served(real.R, real.phase, adapters[s](real, i)))
                continue
            got = real.extra[s]
            reg[s].append(regret_of_served(real.R, real.phase, got[:, i % got.shape[1]]))
    ph = np.concatenate(phases)
    rows = []
    n_ph = len(spec.phases)
    for s in systems:
        r = np.concatenate(reg[s])
        for p in range(n_ph):
            rows.append({**metric_row(spec.name, s, f"regret_phase{p + 1}", r[ph == p], seed0),
                         "phase": p + 1})
    for s in [x for x in GAP_SYSTEMS if x in reg]:
        pp = np.concatenate(reg[s])
        for p in range(n_ph):
            rows.append({**metric_row(spec.name, s, "gap_to_phase_best", pp[ph == p], seed0),
                         "phase": p + 1})
    fs = np.concatenate(reg["frozen-static"])
    for p in range(1, n_ph):
        for s in [x for x in RATIO_SYSTEMS if x in reg]:
            den = np.concatenate(reg[s])[ph == p]
            rows.append(_ratio_row(spec.name, f"frozen-static / {s}", fs[ph == p], den, p + 1,
                                   seed0))
    curves = {s: np.cumsum(np.vstack(reg[s]), axis=1) for s in systems}
    plot_stream(spec.name, curves, spec.length, n_ph, png)

    def used(s: str, p: int) -> dict[str, int]:
        a = np.concatenate(picks[s])[ph == p]
        u, c = np.unique(a, return_counts=True)
        order = np.argsort(-c)[:5]
        return {bundle.names[u[j]]: int(c[j]) for j in order}

    detail = {
        "note": spec.note, "label_key": key, "length": spec.length,
        "phases": [{"mix": ph_.mix, "pool": ph_.pool} for ph_ in spec.phases],
        "frozen_static": bundle.names[static], "phase_best_per_seed": best_names,
        "cum_regret_end": {s: float(curves[s][:, -1].mean()) for s in systems},
        "curves_every_10": {s: np.round(curves[s].mean(axis=0)[9::10], 4).tolist()
                            for s in systems},
        "top_arms": {s: [used(s, p) for p in range(n_ph)] for s in SYSTEMS},
    }
    return rows, detail


def choose_online(specs: list[tuple[StreamSpec, str]], bundles: dict[str, Bundle], learned,
                  seeds: int, seed0: int) -> tuple[OnlineSettings, list[dict]]:
    """`router-policy-online`'s settings: the `ONLINE_GRID` entry with the lowest mean regret on
    the same streams drawn from the **valid** split (streams whose phases all read the main
    pool: a price or corpus change has no valid pool), other seeds than the test streams'.
    Returns (settings, every entry's mean valid regret)."""
    sums = np.zeros(len(ONLINE_GRID))
    count = 0
    for spec, key in specs:
        if any(p.pool != "main" for p in spec.phases):
            continue
        b, lp = bundles[spec.dataset], learned[spec.dataset]
        pools = {"main": Pool(b.R["valid"], b.X["valid"], b.labels["valid"][key])}
        cal = Calibration.from_valid(b.R["valid"], lp.scores(b.X["valid"]),
                                     lp.act(b.X["valid"]))
        for i in range(seeds):
            seed = seed0 + 1000 + i
            real = realise(spec, pools, seed)
            sc = lp.scores(real.X)
            for g, st in enumerate(ONLINE_GRID):
                arms, _ = online_policy(real.R, sc, np.random.default_rng([seed, 2]), st, cal)
                sums[g] += regret(real.R, real.phase, arms).mean()
            count += 1
    means = sums / max(count, 1)
    tried = [{**st.__dict__, "valid_regret": float(m)} for st, m in zip(ONLINE_GRID, means,
                                                                          strict=True)]
    return ONLINE_GRID[int(np.argmin(means))], tried


def make_pools(spec: StreamSpec, key: str, bundle: Bundle, updated: Bundle | None,
               extra: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Pool]:
    """The test-split pools a stream draws from (main; price<x>; updated). `extra`: pool
    name -> {system: (n, S) rewards} of the systems outside the portfolio."""
    extra = extra or {}
    pools = {"main": Pool(bundle.R["test"], bundle.X["test"], bundle.labels["test"][key],
                          bundle.ids["test"], extra.get("main", {}))}
    needs = {p.pool for p in spec.phases}
    for name in sorted(n for n in needs if pool_price(n) is not None):
        pools[name] = Pool(price_matrix(bundle, pool_price(name)), bundle.X["test"],
                           bundle.labels["test"][key], bundle.ids["test"],
                           extra.get(name, {}))
    if "updated" in needs:
        pools["updated"] = Pool(updated.R["test"], updated.X["test"],
                                updated.labels["test"][key], updated.ids["test"],
                                extra.get("updated", {}))
    return pools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=None,
                    help="stream seeds (default 5; --quick 3)")
    ap.add_argument("--length", type=int, default=None,
                    help="queries per phase (default 300; --quick 150)")
    ap.add_argument("--policy", choices=("router",), default="router")
    ap.add_argument("--no-ppo", action="store_true",
                    help="leave out the ppo-policy system (the per-query PPO policy)")
    ap.add_argument("--ppo-base", choices=("router", "none"), default="router",
                    help="router (default, bench/policy.py's design): a residual PPO policy "
                         "that may defer to the supervised router; none: PPO alone")
    a = ap.parse_args()
    for flag, v in (("--seeds", a.seeds), ("--length", a.length)):
        if v is not None and v < 1:
            ap.error(f"{flag}: must be >= 1 (got {v})")
    t0 = time.perf_counter()
    length = a.length or (150 if a.quick else 300)
    a.seeds = a.seeds or (3 if a.quick else 5)
    policy = TunerSettings.defaults()
    datasets = ["synthetic"] if a.quick else ["hotpotqa", "mtrag", "synthetic"]
    bundles = {ds: load_bundle(ds, policy, a.seed) for ds in datasets}
    updated = load_updated_world(policy, bundles["synthetic"])
    t_load = time.perf_counter()
    learned = {ds: fit_learned_policy(a.policy, b, a.seed) for ds, b in bundles.items()}
    t_fit = time.perf_counter()
    ppo = {} if a.no_ppo else {ds: drift_ppo.train(b, learned[ds].router,
                                                   drift_ppo.settings(a.quick), a.seed,
                                                   a.ppo_base)
                               for ds, b in bundles.items()}
    skipped: list[dict] = []
    specs = streams(a.quick, length, bundles, skipped)
    extra: dict[str, dict[str, dict]] = {ds: {} for ds in ppo}
    for spec, _ in specs:  # the frozen PPO policies' rewards on every pool a stream reads
        for name in {p.pool for p in spec.phases} if spec.dataset in ppo else ():
            if name not in extra[spec.dataset]:
                t = ppo[spec.dataset]
                got = (drift_ppo.pool_rewards(t, updated) if name == "updated" else
                       drift_ppo.pool_rewards(t, bundles[spec.dataset], pool_price(name) or 1.0))
                extra[spec.dataset][name] = {PPO_SYSTEM: got}
    t_ppo = time.perf_counter()
    online, online_tried = choose_online(specs, bundles, learned, a.seeds, a.seed)
    print(f"loaded and fitted in {t_fit - t0:.0f}s; online settings {online}", flush=True)
    rows: list[dict] = []
    details: dict[str, Any] = {}
    for spec, key in specs:
        print(f"[{spec.name}] {a.seeds} seeds x {len(spec.phases)} phases x {length}",
              flush=True)
        pools = make_pools(spec, key, bundles[spec.dataset], updated, extra.get(spec.dataset))
        adapters = ({} if spec.dataset not in ppo else {PPO_ONLINE: drift_ppo.online_served(
            ppo[spec.dataset], bundles[spec.dataset], updated, pool_price)})
        r, d = run_stream(spec, key, pools, bundles[spec.dataset], learned[spec.dataset],
                          make_bandit, a.seeds, a.seed,
                          RESULTS / f"drift-{spec.name}{'.quick' if a.quick else ''}.png",
                          online, adapters)
        rows.extend(r)
        details[spec.name] = {**d, "dataset": spec.dataset,
                              "policy": learned[spec.dataset].describe}
    files = {} if a.quick else {d: data_root() / d for d in datasets if d != "synthetic"}
    meta = make_meta(a.seed, files, {
        "quick": a.quick, "wall_s": round(time.perf_counter() - t0, 1), "seeds": a.seeds,
        "load_s": round(t_load - t0, 1), "fit_s": round(t_fit - t_load, 1),
        "ppo_s": round(t_ppo - t_fit, 1), "ppo_base": None if a.no_ppo else a.ppo_base,
        "length": length, "arms": bundles[datasets[0]].names,
        "base_config": policy.base_config().model_dump(mode="json"),
        "reward": {"weights": policy.reward_weights.model_dump(mode="json", by_alias=True),
                   "cost_ref_tokens": policy.cost_ref_tokens, "price_factor": PRICE_FACTOR,
                   "price_drops": list(PRICE_DROPS)},
        "notes": {
            "router_policy": {ds: lp.describe for ds, lp in learned.items()},
            "ppo_policy": {ds: t.describe for ds, t in ppo.items()},
            "ppo_online": (f"rl.routing.ppo_online.adapt_online: configs sampled from the "
                           f"trained ppo-policy, a PPO update every {drift_ppo.ONLINE_BATCH} "
                           "served requests from their rewards only (bandit feedback), the "
                           "Lagrange multiplier stepped with the training budget; no model "
                           "selection") if ppo else None,
            "sw_bandit": f"rl.routing.portfolio_bandit.SlidingWindowUCB, window {SW_WINDOW}, c 0.5, rewards rescaled to "
                         "[0, 1] by the train split's min/max",
            "searcher": f"successive halving, {list(SH_RUNGS)} queries per arm per rung, "
                        f"eta {SH_ETA}, re-run at each shift on the new phase's queries "
                        "(served, so charged as regret)",
            "online": {**online.__dict__, "chosen_on": "valid-split streams "
                       "(choose_online)", "tried": online_tried,
                       "method": "per-arm correction of the "
                       "policy's predicted rewards, refit every query on the last `window` "
                       "logged steps with clipped importance weights, counting each residual "
                       "by its departure from the policy's valid-split residual for that arm "
                       "(served greedily or explored); epsilon-greedy serving"},
            "updated_world": updated.describe,
        },
        "skipped_streams": skipped,
        "bundles": {ds: b.summary() for ds, b in (bundles | {"synthetic-updated": updated})
                    .items()},
        "ppo": {ds: {**t.details, "distinct_test_configs": drift_ppo.distinct_configs(
            t, bundles[ds])} for ds, t in ppo.items()},
        "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
