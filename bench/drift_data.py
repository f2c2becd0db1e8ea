"""Data of the drift benchmark: per dataset the portfolio's per-query matrices on train, valid
and test (`bench.headroom.matrices`: cached tuner rows), the query features and the group
labels the streams mix by; the regenerated synthetic world of the corpus-update stream; and
rewards recomputed under a changed token price.

Arms and features (`drift_arms`): the headroom portfolio and `QueryFeaturizer`'s columns; on
conversational data (MTRAG) bench/policy.py's formulation design as well: each portfolio arm
again with each other query formulation (`with_formulations`: 30 -> 84 arms) and the
retrieval features on each formulation (42 -> 126 columns).

Roles: train (the learned policy is fitted on it), valid (the policy's model selection and
frozen-static's choice), test (the only split streams draw from). Synthetic has no train
split: train and valid are the two halves of its valid split (`_roles`, seeded).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bench.headroom import matrices, segmentations
from rag.types import conversation_of
from rl.kernel.reward import PII_COLUMN
from rl.kernel.settings import TunerSettings
from rl.routing.portfolio import portfolio, with_formulations
from rl.routing.worlds import EvaluatorWorld

UPDATE_WORLD = {"seed": 1, "n_people": 300, "n_companies": 180, "n_questions": 240}
"""`make_synthetic_world` arguments of the corpus update: a new seed and twice the people and
companies (more distractors) of the default world."""
EARLY_TURNS, LATE_TURNS = 2, 5
"""MTRAG turn bands: `early` = turn <= 2, `late` = turn >= 5 (3-4: `mid`, in no phase)."""


@dataclass
class Bundle:
    """One dataset's matrices by role: arm `names`; `R`, `T` (n, K) reward and tokens; `X`
    (n, d) features; `labels[role][key]` group labels; `ids[role]` query ids; `ev` the
    evaluator and `tabs[role]` (the role's split's tables per arm, the role's query indices
    into that split: for price recomputation)."""

    name: str
    names: list[str]
    R: dict[str, np.ndarray]
    T: dict[str, np.ndarray]
    X: dict[str, np.ndarray]
    labels: dict[str, dict[str, np.ndarray]]
    ids: dict[str, np.ndarray]
    ev: Any = None
    tabs: dict[str, tuple[list, np.ndarray]] = field(default_factory=dict)
    describe: str = ""
    arm_descriptors: np.ndarray | None = None
    views: tuple[str, ...] = ()
    """The query-formulation views of the features and arms (`drift_arms`); () = none."""
    conversations: dict[str, np.ndarray] = field(default_factory=dict)
    """Each role's queries' conversations (`rag.types.conversation_of`); a role missing here
    groups each query alone."""

    def summary(self) -> dict[str, Any]:
        return {"n": {r: int(v.shape[0]) for r, v in self.R.items()},
                "groups": {r: {k: _counts(v) for k, v in labs.items() if k != "all"}
                           for r, labs in self.labels.items()}, "describe": self.describe,
                "arms": list(self.names), "formulation_views": list(self.views),
                "n_features": int(next(iter(self.X.values())).shape[1])}


def drift_arms(ev, policy: TunerSettings) -> tuple[list, tuple[str, ...]]:
    """(arms, formulation views) of evaluator `ev`'s dataset: the headroom portfolio, with
    bench/policy.py's formulation arms on conversational data (module docstring)."""
    from rl.routing.features import conversation_views

    views = conversation_views(ev.data.dataset.examples)
    return with_formulations(portfolio(policy), views), views


def _counts(labels: np.ndarray) -> dict[str, int]:
    u, c = np.unique(labels, return_counts=True)
    return {str(a): int(b) for a, b in zip(u, c, strict=True)}


def _roles(data, seed: int) -> dict[str, tuple[str, np.ndarray]]:
    """role -> (split, query indices into it)."""
    tune = "valid"
    n_tune = len(data.examples(tune))
    test = ("test", np.arange(len(data.examples("test"))))
    if "train" in data.splits:
        return {"train": ("train", np.arange(len(data.examples("train")))),
                "valid": (tune, np.arange(n_tune)), "test": test}
    perm = np.random.default_rng(seed).permutation(n_tune)
    half = n_tune // 2
    return {"train": (tune, np.sort(perm[:half])), "valid": (tune, np.sort(perm[half:])),
            "test": test}


def group_labels(ds: str, examples) -> dict[str, np.ndarray]:
    """Every label key a stream may mix by: `all`, `bench.headroom.segmentations`' keys, and
    for MTRAG `turn-band` (early / mid / late: `EARLY_TURNS`, `LATE_TURNS`)."""
    out = {"all": np.array(["all"] * len(examples))}
    out.update({k: np.asarray(v) for k, v in segmentations(ds, examples).items()})
    if ds == "mtrag":
        def band(e) -> str:
            t = int((e.metadata or {}).get("turn") or 1)
            return "early" if t <= EARLY_TURNS else "late" if t >= LATE_TURNS else "mid"

        out["turn-band"] = np.array([band(e) for e in examples])
    return out


def build_bundle(ds: str, ev, policy: TunerSettings, seed: int, describe: str = "") -> Bundle:
    """Matrices, features and labels of evaluator `ev`'s data by role (module docstring)."""
    from rl.routing.features import QueryFeaturizer
    from rl.routing.router import arm_features

    configs, views = drift_arms(ev, policy)
    roles = _roles(ev.data, seed)
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in roles.values()})}
    examples = {r: [ev.data.examples(s)[i] for i in idx] for r, (s, idx) in roles.items()}
    feat = QueryFeaturizer(ev.memo, policy.base_config(), views)
    X = {r: feat.matrix(ex) for r, ex in examples.items()}
    ev.memo.flush()
    return Bundle(
        ds, [n for n, _ in configs],
        {r: full[s]["R"][idx] for r, (s, idx) in roles.items()},
        {r: full[s]["T"][idx] for r, (s, idx) in roles.items()}, X,
        {r: group_labels(ds, ex) for r, ex in examples.items()},
        {r: np.array([e.id for e in ex]) for r, ex in examples.items()}, ev,
        {r: (full[s]["tabs"], idx) for r, (s, idx) in roles.items()},
        describe or f"{ds}: train/valid/test of TuningData",
        arm_features([c for _, c in configs]), views,
        {r: np.array([conversation_of(e) for e in ex]) for r, ex in examples.items()})


def load_bundle(ds: str, policy: TunerSettings, seed: int) -> Bundle:
    from bench.common import evaluator

    return build_bundle(ds, evaluator(ds, policy)[0], policy, seed)


def load_updated_world(policy: TunerSettings, old: Bundle, seed: int = 0) -> Bundle:
    """The corpus update: the synthetic world regenerated with `UPDATE_WORLD`, opened as
    dataset `synthetic` (same metrics and gates), indexed under the cache and evaluated by the
    tuner's evaluator (its own row store: tables are keyed by corpus fingerprint), latency
    priced by the old world's cost model."""
    from rag.corpus.hygiene import stratified_split
    from rag.corpus.loaders import Dataset
    from rag.corpus.synthetic import make_synthetic_world
    from rag.indexset import IndexSet
    from rag.models import cache_dir
    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator

    w = make_synthetic_world(**UPDATE_WORLD)
    ds = Dataset("synthetic", w.corpus, w.examples, {}, builtin=True)
    m = stratified_split(ds.examples, {"valid": 0.5, "test": 0.5}, seed=13, name="synthetic")
    by_id = {e.id: e for e in ds.examples}
    splits = {s: [by_id[i] for i in ids if i in by_id] for s, ids in m.splits.items()}
    d = cache_dir() / "indexes" / f"synthetic-{w.corpus.fingerprint()}"
    idx = IndexSet.open(d) if (d / "corpus.jsonl").exists() else IndexSet.create(
        w.corpus, d, manifest=ds.manifest_dict(), show_progress=False)
    data = TuningData("synthetic", ds, idx, splits, "synthetic", None)
    ev = TunerEvaluator(data, policy, cost_model=old.ev.cost_model)
    desc = (f"make_synthetic_world({', '.join(f'{k}={v}' for k, v in UPDATE_WORLD.items())}): "
            f"{len(w.corpus)} passages, test split {len(splits['test'])} questions")
    return build_bundle("synthetic", ev, policy, seed, desc)


def priced_reward(ev, tab, factor: float) -> np.ndarray:
    """Per-query reward of table `tab` with the token price (cost weight δ) times `factor`,
    from its stored F, R, latency and tokens (`RewardSpec.per_query`)."""
    spec = ev.reward_spec()
    w = spec.weights.model_copy(update={"delta": spec.weights.delta * factor})
    F, Rel = ev.quality(tab)
    return np.asarray(replace(spec, weights=w).per_query(F, Rel, tab["latency_ms"],
                                                         tab["tokens"], tab.get(PII_COLUMN)),
                      dtype=np.float64)


def price_matrix(bundle: Bundle, factor: float, role: str = "test") -> np.ndarray:
    """(n, K) per-query rewards of `role` with the token price (cost weight δ) multiplied by
    `factor`, recomputed from the stored per-query F, R, latency and tokens (`priced_reward`);
    factor 1 reproduces `bundle.R[role]` (checked)."""
    ev = bundle.ev
    tabs, idx = bundle.tabs[role]

    def with_price(f: float) -> np.ndarray:
        return np.column_stack([priced_reward(ev, tab, f)[idx] for tab in tabs])

    if not np.allclose(with_price(1.0), bundle.R[role], equal_nan=True):
        raise AssertionError("recomputed rewards differ from the evaluator's per-query reward")
    return with_price(factor)


class PricedWorld(EvaluatorWorld):
    """An `EvaluatorWorld` whose rewards charge tokens at `factor` times the stored price
    (`priced_reward`); quality and cost are unchanged. Each table it re-prices is first checked
    to reproduce `TunerEvaluator.per_query_reward` at price 1 on the rows computed so far."""

    def __init__(self, ev, split: str, idx=None, factor: float = 1.0):
        super().__init__(ev, split, idx)
        self.factor = factor

    def reward(self, tab: dict) -> np.ndarray:
        base = super().reward(tab)
        if self.factor == 1.0:
            return base
        done = np.isfinite(np.asarray(tab["tokens"], dtype=np.float64))
        if not np.allclose(priced_reward(self.ev, tab, 1.0)[done], base[done], equal_nan=True):
            raise AssertionError("recomputed rewards differ from the evaluator's per-query "
                                 "reward")
        return priced_reward(self.ev, tab, self.factor)


def served_rewards(ev, split: str, configs, factor: float = 1.0) -> np.ndarray:
    """(n,) reward of configs[i] on query i of `split` (every query of it), with the token
    price times `factor`: what a system that picks any config of the space (not an arm) got.
    Rows come from the evaluator's lazy per-(config, query) tables (computed when missing;
    `PricedWorld`)."""
    n = len(ev.data.examples(split))
    if len(configs) != n:
        raise ValueError(f"{len(configs)} configs for the {n} queries of split {split!r}")
    return np.array([o.reward for o in PricedWorld(ev, split, None, factor).outcomes(configs)])
