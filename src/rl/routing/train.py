"""Train the shipped per-query policy on a dataset: the supervised router
(`rl.routing.router`) over the config portfolio (`rl.routing.portfolio`, plus any configs given),
checked on the holdout split against the best static config and the static default, and
saved as a policy directory the Serve app serves (`serve.policy.dir`, `serving.policy_router`).

    run = train_router_policy("synthetic", TunerSettings.defaults(), "runs/policy/synthetic")
    run.rows        # holdout rows (bench row shape): each system's reward / quality / tokens,
                    # router − best static and router − default with paired bootstrap 95% CIs
    run.verdict     # "router" when its reward CI over best static is above 0, else "best-static"

Roles (`role_indices`): train = the dataset's `train` split when it has
one (a seeded subset of `max_train` queries when longer), valid = its tune split; data without
a train split (the synthetic world, a user's folder) trains on a seeded half of the tune split
and chooses on the other half. The router's hyper-parameters (`select_router_cv`, margin 0:
plain argmax, ties to the best static arm of train ∪ valid) are chosen by grouped
cross-validation over train ∪ valid (folds by conversation, `rag.types.conversation_of`) and
the router is refitted on both. With `equal_cost` a token price holds its mean tokens on valid to the
best static config's there (`SupervisedRouter.fit_token_price`), fitted on the
cross-validation's out-of-fold predictions of the valid queries (`tv_oof`): the refitted
router's own are in-sample there, and a price fitted on them let it overspend on new
queries. The holdout split is read once, after every choice was made.

Rewards are the tuner's per-query rewards (`TunerEvaluator.per_query_reward`: quality − latency
and token cost, no batch gates), quality = αF + βR of the evaluator's F and R (on gold-less
data the tuner's reference-free signal, e.g. F = sig_combined; the report names them), cost = tokens;
every (config, query) row comes from the evaluator's lazy per-query cache, so a second run on
the same data computes nothing. The directory holds `policy.json` + `model.pkl`
(`rl.routing.base.save_policy`, ε = `DEFAULT_EPSILON`) and `report.json` / `report.md`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.types import conversation_of
from rl.stats.rows import cost_pct, delta_row, metric_row, ratio_row

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator

SYSTEMS = ("supervised-router", "best-static", "static-default")
SMALL_DATA = 100
"""Fewer train ∪ valid queries than this get a warning: the router's cross-validated choices
are then mostly noise (its holdout verdict will usually be best static)."""
PROGRESS_S = 30.0
"""Seconds between progress lines while rows are computed (a cold MTRAG run takes minutes)."""
Log = Callable[[str], None]
POLICY_RUN_FILES = ("policy.json", "model.pkl", "report.json", "report.md", "serve.yaml",
                    "split.json", "ppo")
"""What policy training (and `ragpilot router train`) writes into its directory: `overwrite`
removes these, and nothing else."""


def claim_policy_directory(out: Path, overwrite: bool, resumable: bool = False) -> None:
    """Refuse to train a new policy over one already saved in `out` (ConfigError naming
    `out`): a serve.yaml or a rollout may point at it. `overwrite` removes POLICY_RUN_FILES
    first; `resumable` (a PPO run's record under `out`/ppo with resume asked) keeps them."""
    from rl.common.data import claim_directory
    from rl.routing.base import POLICY_FILE

    if not resumable:
        claim_directory(out, POLICY_FILE, "a trained policy", POLICY_RUN_FILES, overwrite)


def role_indices(ev: TunerEvaluator, seed: int, max_train: int | None = None
                 ) -> dict[str, tuple[str, np.ndarray]]:
    """role (train / valid / test) -> (split name, query indices into that split) of the
    TunerEvaluator `ev` (module docstring)."""
    tune, hold = ev.slice.tune_split, ev.slice.holdout_split
    n_tune = len(ev.data.examples(tune))
    test = (hold, np.arange(len(ev.data.examples(hold))))
    if "train" in ev.data.splits:
        train = np.arange(len(ev.data.examples("train")))
        if max_train and len(train) > max_train:
            train = np.sort(np.random.default_rng(seed).choice(train, max_train, replace=False))
        return {"train": ("train", train), "valid": (tune, np.arange(n_tune)), "test": test}
    perm = np.random.default_rng(seed).permutation(n_tune)
    half = n_tune // 2
    return {"train": (tune, np.sort(perm[:half])), "valid": (tune, np.sort(perm[half:])),
            "test": test}


def split_matrices(ev: TunerEvaluator, configs: list[RAGConfig], split: str,
                   idx: np.ndarray | None = None, log: Log | None = None
                   ) -> dict[str, np.ndarray]:
    """(queries × configs) per-query reward R, quality Q (αF + βR) and tokens T of `split`;
    with `idx`, only those queries' rows are computed (the others' may be NaN). `log`: a
    progress line at most every `PROGRESS_S` while rows are computed, and one before the first
    arm, which is the slow one on a cold cache (it builds or loads the indexes and embeds the
    corpus: minutes on SciFact)."""
    cols: dict[str, list[np.ndarray]] = {"R": [], "Q": [], "T": []}
    if log:
        n = len(idx) if idx is not None else "all"
        log(f"  rows {split}: {n} queries × {len(configs)} arms (the first arm loads the "
            "indexes; on a cold cache it builds them and embeds the corpus: minutes)")
    t0 = last = time.perf_counter()
    for i, cfg in enumerate(configs, 1):
        tab = ev.table(cfg, split, idx)
        cols["R"].append(ev.per_query_reward(tab))
        cols["Q"].append(ev.per_query_quality(tab))
        cols["T"].append(np.asarray(tab["tokens"], dtype=np.float64))
        if log and time.perf_counter() - last >= PROGRESS_S and i < len(configs):
            last = time.perf_counter()
            log(f"  rows {split}: {i}/{len(configs)} arms ({last - t0:.0f} s)")
    return {k: np.column_stack(v) for k, v in cols.items()}


@dataclass
class RouterRun:
    """What `train_router_policy` wrote and measured."""

    out: Path
    names: list[str]
    n: dict[str, int]
    best_static: str
    router: dict[str, Any]
    rows: list[dict[str, Any]]
    verdict: str
    choices: dict[str, int] = field(default_factory=dict)
    systems: tuple[str, ...] = SYSTEMS
    warnings: list[str] = field(default_factory=list)
    """Counted, not fatal: e.g. too few queries to learn a per-query choice from."""
    ppo: dict[str, Any] | None = None
    """The PPO learner's record (`rl.routing.train_ppo`), None for the router alone."""
    reason: str = ""
    """Why the verdict, from the rows it rests on (the PPO and cascade learners'; "" for the
    router's)."""
    cascade: dict[str, Any] | None = None
    """The cascade learner's record (`train_cascade_policy`), None for the other learners."""

    @property
    def subject(self) -> str:
        """The system the report is about (the first of `systems`)."""
        return self.systems[0]

    def delta(self, other: str, metric: str = "delta_reward") -> dict[str, Any]:
        """The `subject - other` row of `metric`."""
        return next(r for r in self.rows if r["system"] == f"{self.subject} - {other}"
                    and r["metric"] == metric)

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "arms": self.names, "systems": list(self.systems),
                "n": self.n,
                "best_static": self.best_static, "router": self.router, "rows": self.rows,
                "verdict": self.verdict, "test_choices": self.choices,
                "warnings": self.warnings,
                **({"reason": self.reason} if self.reason else {}),
                **({} if self.ppo is None else {"ppo": self.ppo}),
                **({} if self.cascade is None else {"cascade": self.cascade})}


def holdout_rows(dataset: str, M: dict[str, np.ndarray], picks: dict[str, np.ndarray],
                 seed: int = 0, subject: str = "supervised-router") -> list[dict[str, Any]]:
    """Rows of the holdout matrices `M` (R, Q, T) for each system's arm per query (`picks`):
    `system_rows` of what each system's picks get."""
    from rl.stats.headroom import pick

    got = {s: {k: pick(M[k], ch) for k in ("R", "Q", "T")} for s, ch in picks.items()}
    return system_rows(dataset, got, seed, subject)


def system_rows(dataset: str, got: dict[str, dict[str, np.ndarray]], seed: int = 0,
                subject: str = "supervised-router") -> list[dict[str, Any]]:
    """Rows of each system's per-query holdout reward, quality and tokens (`got[system]`
    {"R", "Q", "T"}, the same queries in the same order): its means with bootstrap 95% CIs
    (`rl.stats.rows.metric_row`), then `delta_rows` of `subject` against every other system."""
    rows = [metric_row(dataset, s, metric, g[k], seed) for s, g in got.items()
            for k, metric in (("R", "reward"), ("Q", "quality"), ("T", "tokens"))]
    return rows + delta_rows(dataset, got, subject, [s for s in got if s != subject], seed)


def delta_rows(dataset: str, got: dict[str, dict[str, np.ndarray]], subject: str,
               others: list[str], seed: int = 0) -> list[dict[str, Any]]:
    """`subject - X` rows for each X of `others` (`got` as `system_rows`): delta_reward,
    delta_quality (paired bootstrap 95% CIs over queries, `rl.stats.rows.delta_row`) and
    delta_cost_pct (100 · (mean tokens / X's − 1), `rl.stats.rows.ratio_row`)."""
    rows = []
    r = got[subject]
    for other in others:
        o, name = got[other], f"{subject} - {other}"
        rows += [delta_row(dataset, name, metric, o[k], r[k], seed)
                 for k, metric in (("R", "delta_reward"), ("Q", "delta_quality"))]
        rows.append(ratio_row(dataset, name, "delta_cost_pct", r["T"], o["T"], cost_pct, seed))
    return rows


@dataclass
class Prepared:
    """What both learners of `ragpilot router train` start from (`prepare`): the evaluator,
    the arms, each role's (queries × arms) matrices and features, and the conversation group
    of every train ∪ valid query (in that order)."""

    ev: TunerEvaluator
    out: Path
    dataset: str
    names: list[str]
    configs: list[RAGConfig]
    parts: dict[str, tuple[str, np.ndarray]]
    M: dict[str, dict[str, np.ndarray]]
    X: dict[str, np.ndarray]
    feature_names: list[str]
    groups: dict[str, list[str]]
    warnings: list[str]

    @property
    def X_tv(self) -> np.ndarray:
        return np.vstack([self.X["train"], self.X["valid"]])

    def tv(self, key: str) -> np.ndarray:
        """The train ∪ valid rows of matrix `key` (R, Q or T)."""
        return np.vstack([self.M["train"][key], self.M["valid"][key]])

    @property
    def tv_groups(self) -> list[str]:
        return self.groups["train"] + self.groups["valid"]


def prepare(dataset: str, settings: Any, out: str | Path, *, seed: int = 0,
            max_train: int | None = None, extra: list[tuple[str, RAGConfig]] | None = None,
            compare_to: tuple[str, ...] = (), log: Log | None = None,
            overwrite: bool = False, resumable: bool = False) -> Prepared:
    """Check the input, open `dataset`, and compute every arm's rows and every query's
    features for the roles (`role_indices`); see `train_router_policy` for the errors.
    `log`: one line per stage (and progress while rows are computed), None for silence.
    `overwrite`, `resumable`: `claim_policy_directory`, done once the arguments are checked."""
    from rl.common.data import TuningData, run_directory
    from rl.kernel.evaluator import TunerEvaluator
    from rl.routing.features import QueryFeaturizer, conversation_views
    from rl.routing.portfolio import portfolio, with_formulations
    from rl.routing.router import CV_FOLDS

    say = log or (lambda _m: None)
    out = Path(out)
    arms = portfolio(settings)
    for name, cfg in extra or []:
        if name in {n for n, _ in arms}:
            raise ConfigError("extra", f"{name!r} is already an arm's name (the portfolio's or "
                                       "one given before)")
        same = [n for n, c in arms if c.config_hash == cfg.config_hash]
        if same:
            raise ConfigError("extra", f"{name} ({cfg.config_hash}) is the same config as arm "
                                       f"{same[0]!r}")
        arms.append((name, cfg))
    names = [n for n, _ in arms]
    for name in compare_to:
        if name not in names:
            raise ConfigError("compare_to", f"{name!r} is not an arm ({', '.join(names)})")
    if Path(dataset).exists():
        dataset = str(Path(dataset).resolve())
    claim_policy_directory(out, overwrite, resumable)
    # after the checks above; refused data (unreadable, or gold the corpus cannot reach for
    # most of a split) leaves no directory behind either, the rest of the gold is counted
    with run_directory(out) as out:
        ev = TunerEvaluator(TuningData.open(dataset, run_dir=out), settings)
        gold_warnings = [w for s in ev.data.check_gold(list(ev.data.splits), override=None)
                         for w in ev.data.gold_warnings(s)]
    # conversational data: each arm also per query formulation, and the features that tell
    # how each formulation retrieves (together: either alone does not help)
    views = conversation_views(ev.data.dataset.examples)
    if views:
        arms = with_formulations(arms, views, skip={n for n, _ in extra or []})
    names, configs = [n for n, _ in arms], [c for _, c in arms]
    if max_train and "train" not in ev.data.splits:  # role_indices would ignore it
        raise ConfigError("max_train", f"{ev.data.name} has no train split: the router trains "
                                       "on a seeded half of its valid split (drop the cap)")
    parts = role_indices(ev, seed, max_train)
    if min(len(idx) for _, idx in parts.values()) < 2:
        raise ConfigError("dataset", f"{dataset}: train, valid and test need >= 2 queries each "
                                     f"(got {({r: len(i) for r, (_, i) in parts.items()})})")
    say(f"policy data {ev.data.name}: {len(configs)} arms; queries "
        + ", ".join(f"{role} {len(idx)} ({split})" for role, (split, idx) in parts.items()))
    t0 = time.perf_counter()
    need: dict[str, list[np.ndarray]] = {}
    for split, idx in parts.values():  # only the roles' queries (e.g. --max-train's subset)
        need.setdefault(split, []).append(idx)
    full = {s: split_matrices(ev, configs, s, np.unique(np.concatenate(v)), log)
            for s, v in sorted(need.items())}
    say(f"  rows: {len(configs)} arms × {sum(len(i) for _, i in parts.values())} queries "
        f"({time.perf_counter() - t0:.0f} s; cached rows are reused)")
    t0 = time.perf_counter()
    feat = QueryFeaturizer(ev.memo, settings.base_config(), views)
    M, X = {}, {}
    for role, (split, idx) in parts.items():
        M[role] = {k: v[idx] for k, v in full[split].items()}
        X[role] = feat.matrix([ev.data.examples(split)[int(i)] for i in idx])
    ev.memo.flush()
    say(f"  features: {len(feat.names)} per query ({time.perf_counter() - t0:.0f} s)")
    groups = {role: [conversation_of(ev.data.examples(split)[int(i)]) for i in idx]
              for role, (split, idx) in parts.items()}
    tv_groups = groups["train"] + groups["valid"]
    n_tv, n_conversations = len(tv_groups), len(set(tv_groups))
    if n_conversations < CV_FOLDS:
        raise ConfigError("dataset", f"{dataset}: the router's {CV_FOLDS}-fold cross-validation "
                                     f"needs >= {CV_FOLDS} conversations in train ∪ valid, got "
                                     f"{n_conversations}")
    warnings = ([f"only {n_tv} train ∪ valid queries (< {SMALL_DATA}): the router's "
                 "cross-validated choices are mostly noise here; expect its holdout verdict to be "
                 "the best static config, and give it more data before trusting a per-query "
                 "gain"]
                if n_tv < SMALL_DATA else []) + gold_warnings
    return Prepared(ev, out, dataset, names, configs, parts, M, X, list(feat.names), groups,
                    warnings)


def fit_router(prep: Prepared, seed: int = 0, log: Log | None = None) -> tuple[Any, Any]:
    """The router chosen by grouped cross-validation over train ∪ valid and refitted on both
    (`select_router_cv`), and the selection record."""
    from rl.routing.router import (
        CV_FOLDS,
        CV_MARGINS,
        PARAM_GRID,
        arm_features,
        select_router_cv,
    )

    t0 = time.perf_counter()
    if log:
        m = len(CV_MARGINS)
        log(f"  router: {len(PARAM_GRID)} parameter sets × {m} margin{'s' * (m != 1)}, grouped "
            f"{CV_FOLDS}-fold CV over {len(prep.tv_groups)} train ∪ valid queries")
    router, sel = select_router_cv(prep.X_tv, prep.tv("R"), prep.tv("T"), prep.tv_groups,
                                   seed=seed, arms=arm_features(prep.configs), log=log)
    if log:
        log(f"  router: margin {router.margin:g} over `{prep.names[router.static_arm]}`, CV "
            f"reward {sel.tried[sel.best]['cv_reward']:.4f} ({time.perf_counter() - t0:.0f} s)")
    return router, sel


def tv_oof(prep: Prepared, router: Any, sel: Any, seed: int = 0) -> np.ndarray:
    """The out-of-fold predictions (n_train + n_valid, K) of `router`'s parameters over
    train ∪ valid in that order (`sel.oof`; recomputed with the same folds for a selection
    pickled before `Selection.oof` existed). Every equal-cost price is fitted on the valid
    rows of these: on them the refitted router's own predictions are in-sample."""
    from rl.routing.router import CV_FOLDS, arm_features, out_of_fold_scores

    oof = getattr(sel, "oof", None)
    if oof is None:
        oof = out_of_fold_scores(router.params, prep.X_tv, prep.tv("R"), prep.tv("T"),
                                 arm_features(prep.configs), prep.tv_groups, CV_FOLDS, seed)
    return oof


def train_router_policy(dataset: str, settings: Any, out: str | Path, *, seed: int = 0,
                        max_train: int | None = None,
                        extra: list[tuple[str, RAGConfig]] | None = None,
                        equal_cost: bool = False, compare_to: tuple[str, ...] = (),
                        log: Log | None = None, overwrite: bool = False) -> RouterRun:
    """Fit, choose, check and save the router policy of `dataset` (a name or a path the
    loaders read) with `settings` (TunerSettings: reward, base config, space) under `out`
    (module docstring); `max_train` on data without a train split is a ConfigError naming
    `max_train`, an `out` that cannot be a directory one naming `out`. `extra`: (name, config)
    arms added to the portfolio (e.g. the config `ragpilot tune` found); a name or config
    already in it is a ConfigError naming `extra`.
    `compare_to`: arm names compared with the router on the holdout besides best static and
    the default (e.g. "tuned"); an unknown name is a ConfigError naming `compare_to`.
    `log`: a line per stage (`prepare`), None for silence. An `out` that holds a trained
    policy is a ConfigError naming `out` unless `overwrite` (`claim_policy_directory`)."""
    from rl.routing.base import DEFAULT_EPSILON, RouterPolicy, save_policy
    from rl.stats.headroom import best_static, pick

    prep = prepare(dataset, settings, out, seed=seed, max_train=max_train, extra=extra,
                   compare_to=compare_to, log=log, overwrite=overwrite)
    ev, out, names, configs, M, X = prep.ev, prep.out, prep.names, prep.configs, prep.M, prep.X
    R_tv = prep.tv("R")
    router, sel = fit_router(prep, seed, log)
    static = best_static(M["valid"]["R"])
    if equal_cost:  # else the price select_router_cv's router has: 0
        # on valid, where the budget is measured (best static alone spends exactly it), by
        # the cross-validation's out-of-fold predictions (the router's own are in-sample)
        router.fit_token_price(None, M["valid"]["T"], float(M["valid"]["T"][:, static].mean()),
                               scores=tv_oof(prep, router, sel, seed)[len(X["train"]):])
    test = M["test"]
    n_test = len(test["R"])
    ch = router.choose(X["test"])
    picks = {"supervised-router": ch, "best-static": np.full(n_test, static),
             "static-default": np.zeros(n_test, dtype=int),
             **{name: np.full(n_test, names.index(name)) for name in compare_to}}
    rows = holdout_rows(ev.data.name, test, picks, seed)
    gain = next(r for r in rows if r["system"] == "supervised-router - best-static"
                and r["metric"] == "delta_reward")
    verdict = "router" if gain["ci_low"] > 0 else "best-static"
    save_policy(RouterPolicy(router, configs), out, base_config=settings.base_config(),
                names=names, feature_names=prep.feature_names, epsilon=DEFAULT_EPSILON,
                kind="router")
    valid_reward = float(pick(M["valid"]["R"], router.choose(X["valid"])).mean())
    run = RouterRun(out, names, {r: len(i) for r, (_, i) in prep.parts.items()}, names[static],
                    {"params": asdict(router.params), "token_price": router.token_price,
                     "equal_cost": equal_cost, "valid_reward": valid_reward,
                     "best_static_valid_reward": float(M["valid"]["R"][:, static].mean()),
                     "selection": "cv", "margin": router.margin,
                     "static_arm": names[router.static_arm],
                     "cv_reward": sel.tried[sel.best]["cv_reward"],
                     "cv_static_reward": float(R_tv[:, router.static_arm].mean()),
                     "quality_metrics": [ev.slice.faithfulness, ev.slice.relevancy]},
                    rows, verdict, counts_of([names[int(a)] for a in ch]),
                    tuple(picks), prep.warnings)
    (out / "report.json").write_text(json.dumps(run.to_dict(), indent=1) + "\n")
    (out / "report.md").write_text(markdown(run, prep.dataset))
    return run


CASCADE_SYSTEMS = ("cascade", "best-static", "static-default")


def train_cascade_policy(dataset: str, settings: Any, out: str | Path, *, seed: int = 0,
                         max_train: int | None = None,
                         extra: list[tuple[str, RAGConfig]] | None = None,
                         log: Log | None = None, overwrite: bool = False) -> RouterRun:
    """Fit, check and save the threshold cascade of `dataset` (`rl.routing.cascade`) under
    `out`, as `bench/cascade.py` chooses it at equal cost: the attempt signals (with the
    reference-free answer signals) of each cheap candidate (`cheap_candidates`) over every
    role, the abstention column (`with_abstention`), then `select_cascade` on train and valid
    only with the budget = the best static config's mean tokens on valid. The holdout is read
    once, after: `system_rows` of cascade, best static and the static default (quality and
    tokens apart, paired bootstrap CIs). Verdict: `cascade_verdict` with the tuner settings'
    non-inferiority margin (`objective.margin`). Arguments and errors as
    `train_router_policy`; a budget no cascade meets is a ConfigError naming `budget`."""
    from rl.routing.base import DEFAULT_EPSILON, save_policy
    from rl.routing.cascade import (
        CascadePolicy,
        cascade_inputs,
        cascade_policy,
        outcomes,
        select_cascade,
    )
    from rl.stats.headroom import best_static, pick

    say = log or (lambda _m: None)
    prep = prepare(dataset, settings, out, seed=seed, max_train=max_train, extra=extra,
                   log=log, overwrite=overwrite)
    ev, out, names, configs = prep.ev, prep.out, prep.names, prep.configs
    static = best_static(prep.M["valid"]["R"])
    budget = float(prep.M["valid"]["T"][:, static].mean())
    M, col_names, Z = cascade_inputs(prep, budget, log)
    cas = select_cascade(M, {c: {r: z[r] for r in ("train", "valid")} for c, z in Z.items()},
                         col_names, budget, seed)
    policy = cascade_policy(cas, configs, names, prep.feature_names, True)
    say(f"  cascade: `{cas.names[0]}` -> `{cas.names[1]}` at tau {cas.tau:.4f} (valid quality "
        f"{cas.valid['quality']:.4f}, tokens {cas.valid['tokens']:.0f} of {budget:.0f})")
    test = M["test"]
    n_test = len(test["R"])
    esc = cas.escalate(Z[cas.cheap]["test"])
    got = {"cascade": outcomes(test, cas.cheap, cas.strong, esc),
           **{s: {k: pick(test[k], np.full(n_test, j)) for k in ("R", "Q", "T")}
              for s, j in (("best-static", static), ("static-default", 0))}}
    rows = system_rows(ev.data.name, got, seed, subject="cascade")
    verdict, reason = cascade_verdict(rows, settings.objective.margin)
    save_policy(policy, out, base_config=settings.base_config(), names=policy.names,
                feature_names=prep.feature_names, epsilon=DEFAULT_EPSILON,
                kind=CascadePolicy.KIND, details=policy.manifest())
    record = {**policy.manifest(), "strong": cas.names[1], "budget_tokens": budget,
              "test_escalated": float(esc.mean()),
              "quality_metrics": [ev.slice.faithfulness, ev.slice.relevancy]}
    run = RouterRun(out, names, {r: len(i) for r, (_, i) in prep.parts.items()}, names[static],
                    {}, rows, verdict,
                    counts_of([cas.names[int(e)] for e in esc]), CASCADE_SYSTEMS,
                    prep.warnings, reason=reason, cascade=record)
    (out / "report.json").write_text(json.dumps(run.to_dict(), indent=1) + "\n")
    (out / "report.md").write_text(markdown(run, prep.dataset))
    return run


def cascade_verdict(rows: list[dict[str, Any]], margin: float) -> tuple[str, str]:
    """(verdict, reason) of a cascade from its holdout rows against best static, in the
    objective's two terms: "cascade" when its quality gain has a 95% CI above 0 and its token
    cost is not significantly above (`delta_cost_pct` CI low ≤ 0), or when it is significantly
    cheaper (CI high < 0) at non-inferior quality (`delta_quality` CI low ≥ −`margin`);
    otherwise "best-static". The reason quotes both rows. ValueError when a row is missing."""
    def d(metric: str) -> dict[str, Any]:
        for r in rows:
            if r["system"] == "cascade - best-static" and r["metric"] == metric:
                return r
        raise ValueError(f"no 'cascade - best-static' {metric} row: the verdict rests on it")

    q, c = d("delta_quality"), d("delta_cost_pct")
    said = (f"quality {q['value']:+.4f} [{q['ci_low']:+.4f}, {q['ci_high']:+.4f}], tokens "
            f"{c['value']:+.1f}% [{c['ci_low']:+.1f}%, {c['ci_high']:+.1f}%] vs best static")
    if q["ci_low"] > 0 and c["ci_low"] <= 0:
        return "cascade", f"better quality at no significant extra cost: {said}"
    if c["ci_high"] < 0 and q["ci_low"] >= -margin:
        return "cascade", f"cheaper at non-inferior quality (margin {margin:g}): {said}"
    return "best-static", said


def counts_of(labels: list[str]) -> dict[str, int]:
    """Label -> count, most frequent first (ties in order of first appearance)."""
    return dict(Counter(labels).most_common())


VERDICTS = {
    "router": "Verdict: **serve the router** — its reward gain over the best static config has "
              "a 95% CI above 0.",
    "ppo-policy": "Verdict: **serve the PPO policy** — {reason}.",
    "supervised-router": "Verdict: **serve the supervised router** (`ragpilot router train` "
                         "without `--learner ppo`) — {reason}.",
    "cascade": "Verdict: **serve the cascade** — {reason}.",
    "best-static": "Verdict: **serve the best static config** (`{best}`) — the {who}'s {gain} "
                   "gain over it has no 95% CI above 0 on this holdout{reason}.",
}


def markdown(run: RouterRun, dataset: str) -> str:
    """`report.md` of a RouterRun: what was trained, the holdout table, the verdict."""
    def fmt(r: dict[str, Any], pct: bool = False) -> str:
        f = "{:+.1f}%" if pct else ("{:+.4f}" if r["metric"].startswith("delta") else "{:.4f}")
        ci = (f" [{f.format(r['ci_low'])}, {f.format(r['ci_high'])}]"
              if r["ci_low"] is not None else "")
        return f.format(r["value"]) + ci

    by = {(r["system"], r["metric"]): r for r in run.rows}
    cr = run.cascade
    title = ("PPO policy" if run.ppo is not None else "threshold cascade" if cr is not None
             else "router policy")
    lines = [f"# Per-query {title}: {dataset}", "",
             f"Arms: {len(run.names)} configs (`rl.routing.portfolio` + given). Queries: "
             + ", ".join(f"{k} {v}" for k, v in run.n.items()) + f". Best static on valid: "
             f"`{run.best_static}`."]
    if cr is not None:
        lines[-1] += (f" Cascade (`rl.routing.cascade`, chosen on train and valid at equal "
                      f"cost: {cr['budget_tokens']:.0f} tokens on valid): `{cr['cheap']}` "
                      f"answers, below confidence τ = {cr['tau']:.4f} it escalates to "
                      f"`{cr['stage2']}` (valid: quality {cr['valid']['quality']:.4f}, tokens "
                      f"{cr['valid']['tokens']:.0f}, escalated {cr['valid']['escalated']:.2f}; "
                      f"test escalated {cr['test_escalated']:.2f}).")
    else:
        params = ", ".join(f"{k} {v}" for k, v in run.router["params"].items())
        lines[-1] += (f" Router chosen by cross-validation over train ∪ valid: "
                      f"{params}, margin {run.router['margin']:g} over "
                      f"`{run.router['static_arm']}` (CV reward {run.router['cv_reward']:.4f} "
                      f"vs that arm's {run.router['cv_static_reward']:.4f}; token price "
                      f"{run.router['token_price']:.2e}).")
    lines.append("")
    if run.ppo is not None:
        p = run.ppo
        lines += [f"PPO (`rl.routing.train_ppo`): a residual policy over the router held to "
                  f"best static's valid tokens ({p['budget_tokens']:.0f}); {len(p['seeds'])} "
                  f"seed(s) × {p['iters']} iterations, the seed best on valid kept (seed "
                  f"{p['chosen_seed']}: start `{p['warm_start']}`, valid reward "
                  f"{p['valid_reward']:.4f} vs the router's {p['router_valid_reward']:.4f}); "
                  f"it defers {100 * p['test_deferred']:.0f}% of the holdout queries to the "
                  f"router and picks {p['distinct_test_configs']} distinct configs.", ""]
    fr = (cr or run.router).get("quality_metrics")  # gold-less data: F is a reference-free signal
    lines += ["Holdout (read once): mean per query, bootstrap 95% CIs; deltas are paired."
              + (f" Quality = αF + βR with F = `{fr[0]}`, R = `{fr[1]}`." if fr else ""), "",
              "| system | reward | quality | tokens |", "|---|---|---|---|"]
    for s in run.systems:
        lines.append(f"| {s} | {fmt(by[(s, 'reward')])} | {fmt(by[(s, 'quality')])} | "
                     f"{by[(s, 'tokens')]['value']:.0f} |")
    lines += ["", "| comparison | delta_reward | delta_quality | delta_cost_pct |",
              "|---|---|---|---|"]
    comparisons = [f"{run.subject} - {other}" for other in run.systems[1:]]
    comparisons += [c for c in dict.fromkeys(r["system"] for r in run.rows if " - " in r["system"])
                    if c not in comparisons]  # e.g. the router's own gain in a PPO report
    for c in comparisons:
        lines.append(f"| {c} | {fmt(by[(c, 'delta_reward')])} | "
                     f"{fmt(by[(c, 'delta_quality')])} | "
                     f"{fmt(by[(c, 'delta_cost_pct')], pct=True)} |")
    top = ", ".join(f"`{k}` {v}" for k, v in list(run.choices.items())[:6])
    if run.warnings:
        lines += ["", f"Warnings ({len(run.warnings)}):", *(f"- {w}" for w in run.warnings)]
    who = "PPO policy" if run.ppo is not None else "cascade" if cr is not None else "router"
    lines += ["", f"The {who}'s holdout choices (top 6): {top}.", "",
              VERDICTS[run.verdict].format(
                  best=run.best_static, who=who,
                  gain="quality or token" if cr is not None else "reward",
                  reason=(f" ({run.reason})" if run.reason and run.verdict == "best-static"
                          else run.reason)),
              "", f"Serve {'this directory' if run.ppo is not None else 'it'}: "
              f"`serve: {{policy: {{dir: {run.out}}}, traffic: {{mode: policy}}}}` "
              "(`serving.policy_router`); `ragpilot router train` writes that Serve config "
              f"as `{run.out}/serve.yaml` (`ragpilot serve --config` it).", ""]
    return "\n".join(lines)
