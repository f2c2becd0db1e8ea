"""Per-query policies against the best static config: the supervised router (issue 19's B3)
and the per-segment lookup (B2), on HotpotQA, SciFact and MTRAG.

    python bench/policy.py                 # full: 3 datasets, train / valid / test
    python bench/policy.py --quick         # < 2 min: the synthetic world
    python bench/policy.py --render-only   # rewrite policy.md from policy.json

Arms: the 30-config portfolio of `bench/headroom.py` (`PORTFOLIO`), plus the best-known config
of the searchers' benchmark (`bench/results/search.json`, `meta.details[<dataset>].best_known`)
when that file exists. Every arm is evaluated on every query of train, valid and test through
the tuner's per-query tables (`TunerEvaluator.table`): reward = `per_query_reward`, quality =
αF + βR, cost = tokens. Features: `rl.policy.features.QueryFeaturizer` over the memoised
indexes with the policy's base config (no gold).

Protocol (test is touched once, after every choice is made):
  * `best-static`: the arm with the best mean reward on valid;
  * `supervised-router`: per-arm gradient boosting fitted on train, hyper-parameters
    (`rl.policy.router.PARAM_GRID`) chosen by realised reward on valid;
  * `supervised-router-equal-cost`: the same router with a token price chosen on valid so
    that its mean tokens there stay at most best-static's;
  * `per-segment-best`: the best arm per segment (HotpotQA type, SciFact gold-doc count, MTRAG
    domain × turn: `bench.headroom.segmentations`, dataset labels a serving policy would not
    have), chosen on train ∪ valid; unseen segments take the train ∪ valid best arm;
  * `per-query-oracle`: each test query's best arm (the upper bound).
Synthetic (no train split): train and valid are the two halves of its valid split (seeded).
SciFact: `TuningData` loads only the BEIR test qrels, so its committed train ids (809) are read
from `qrels/train.tsv` here (`add_beir_train`).

Rows on test: each system's `reward`, `quality`, `tokens` (mean, bootstrap 95% CI over
queries); `<system> - best-static` `delta_reward`, `delta_quality` (paired bootstrap 95% CI)
and `delta_cost_pct` (100·(mean tokens / best-static's − 1), paired bootstrap CI); and
`<system>` `headroom_captured` = mean(system − best-static) / mean(oracle − best-static),
paired bootstrap CI of the ratio. No `ppo-policy` rows: that policy is not built yet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, make_meta, metric_row, rerender, write_results  # noqa: E402
from bench.headroom import MAIN_SEGMENTS, matrices, portfolio, segmentations  # noqa: E402
from bench.policy_report import TITLE, markdown  # noqa: E402
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.policy.features import FEATURE_NAMES, QueryFeaturizer  # noqa: E402
from rl.policy.router import SegmentLookup, arm_features, select_router  # noqa: E402
from rl.stats.bootstrap import bootstrap_statistic, paired_bootstrap  # noqa: E402
from rl.stats.headroom import best_static, oracle_choice, pick  # noqa: E402
from rl.tuner.settings import TunerSettings  # noqa: E402

NAME = "policy"
BASELINE = "best-static"
SYSTEMS = ("supervised-router", "supervised-router-equal-cost", "per-segment-best",
           "per-query-oracle")
SEARCH_JSON = RESULTS / "search.json"


def search_best(ds: str, path: Path = SEARCH_JSON) -> RAGConfig | None:
    """The best-known config of `bench/search.py`'s run on `ds`, or None without one."""
    if not path.exists():
        return None
    details = json.loads(path.read_text()).get("meta", {}).get("details", {})
    cfg = (details.get(ds) or {}).get("best_known", {}).get("config")
    return RAGConfig.from_dict(cfg) if cfg else None


def arms(ds: str, policy: TunerSettings, search_json: Path = SEARCH_JSON
         ) -> list[tuple[str, RAGConfig]]:
    """The headroom portfolio, plus the searchers' best-known config when there is one."""
    out = portfolio(policy)
    best = search_best(ds, search_json)
    if best is not None and best.config_hash not in {c.config_hash for _, c in out}:
        out.append(("search-best-known", best))
    return out


def add_beir_train(data) -> int:
    """Give a BEIR dataset opened by `TuningData` its committed `train` split, which the loader
    drops (it reads only `qrels/test.tsv`, so SciFact's 809 train ids find no example): the
    manifest's train ids are read from `qrels/train.tsv` over the same corpus. Returns how many
    train examples were added (0 when the data already has them or has no such file)."""
    from rag.corpus.hygiene import SPLITS_DIR

    qrels = data_root() / data.name / "qrels" / "train.tsv"
    manifest = Path(SPLITS_DIR) / f"{data.name}.json"
    if "train" in data.splits or not qrels.exists() or not manifest.exists():
        return 0
    from rag.corpus.loaders import load_beir

    ids = json.loads(manifest.read_text())["splits"].get("train", [])
    by_id = {e.id: e for e in load_beir(data_root() / data.name, "train").examples}
    held = {e.id for s in data.splits.values() for e in s}
    train = [by_id[i] for i in ids if i in by_id and i not in held]
    if train:
        data.splits["train"] = train
    return len(train)


def _parts(ev, seed: int) -> dict[str, tuple[str, np.ndarray]]:
    """role (train / valid / test) -> (split name, query indices into that split)."""
    tune, hold = ev.slice.tune_split, ev.slice.holdout_split
    n_tune = len(ev.data.examples(tune))
    test = (hold, np.arange(len(ev.data.examples(hold))))
    if "train" in ev.data.splits:
        return {"train": ("train", np.arange(len(ev.data.examples("train")))),
                "valid": (tune, np.arange(n_tune)), "test": test}
    perm = np.random.default_rng(seed).permutation(n_tune)
    half = n_tune // 2
    return {"train": (tune, np.sort(perm[:half])), "valid": (tune, np.sort(perm[half:])),
            "test": test}


def _delta_rows(ds: str, system: str, M: dict[str, np.ndarray], ch: np.ndarray, base: int,
                oracle: np.ndarray, seed: int) -> list[dict]:
    """`system - best-static` deltas and the system's headroom share (module docstring)."""
    name = f"{system} - {BASELINE}"
    rows = []
    for metric, X in (("delta_reward", M["R"]), ("delta_quality", M["Q"])):
        r = paired_bootstrap(X[:, base], pick(X, ch), seed=seed)
        rows.append({"dataset": ds, "system": name, "metric": metric, "value": r.mean_diff,
                     "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n})
    Ta, Tb = M["T"][:, base], pick(M["T"], ch)
    rows.append(_ratio_row(ds, name, "delta_cost_pct", Tb, Ta, seed,
                           lambda a, b: 100.0 * (a / b - 1.0)))
    Rb, Rs, Ro = M["R"][:, base], pick(M["R"], ch), pick(M["R"], oracle)
    if system != "per-query-oracle":
        rows.append(_ratio_row(ds, system, "headroom_captured", Rs - Rb, Ro - Rb, seed,
                               lambda a, b: a / b))
    return rows


def _ratio_row(ds: str, system: str, metric: str, num: np.ndarray, den: np.ndarray, seed: int,
               f) -> dict:
    """f(mean(num), mean(den)) with a paired bootstrap 95% CI over queries."""
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = bootstrap_statistic(lambda idx: f(num[idx].mean(axis=1), den[idx].mean(axis=1)),
                                   num.size, seed=seed)
        value = float(f(num.mean(), den.mean()))
    boot = boot[np.isfinite(boot)]
    lo, hi = (np.quantile(boot, [0.025, 0.975]) if boot.size else (np.nan, np.nan))
    return {"dataset": ds, "system": system, "metric": metric, "value": value,
            "ci_low": float(lo), "ci_high": float(hi), "n": int(num.size)}


def run_dataset(ds: str, policy: TunerSettings, seed: int, rows: list, details: dict,
                search_json: Path = SEARCH_JSON) -> None:
    from rl.common.data import TuningData
    from rl.tuner.evaluator import TunerEvaluator

    t0 = time.perf_counter()
    ev = TunerEvaluator(TuningData.open(ds), policy)
    added = add_beir_train(ev.data)
    configs = arms(ds, policy, search_json)
    names = [n for n, _ in configs]
    parts = _parts(ev, seed)
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M = {role: {k: full[s][k][idx] for k in ("R", "Q", "T")} for role, (s, idx) in parts.items()}
    examples = {role: [ev.data.examples(s)[i] for i in idx] for role, (s, idx) in parts.items()}
    t1 = time.perf_counter()
    feat = QueryFeaturizer(ev.memo, policy.base_config())
    X = {role: feat.matrix(ex) for role, ex in examples.items()}
    ev.memo.flush()
    feat_s = time.perf_counter() - t1

    base = best_static(M["valid"]["R"])
    budget = float(M["valid"]["T"][:, base].mean())
    router, sel = select_router(X["train"], M["train"]["R"], X["valid"], M["valid"]["R"],
                                M["train"]["T"], seed=seed,
                                arms=arm_features([c for _, c in configs]))
    plain = router.choose(X["test"], 0.0)
    price = router.fit_token_price(X["valid"], M["valid"]["T"], budget)
    eq = router.choose(X["test"], price)
    key = MAIN_SEGMENTS.get(ds, "type")
    seg_labels = {role: segmentations(ds, ex)[key] for role, ex in examples.items()}
    both = np.vstack([M["train"]["R"], M["valid"]["R"]])
    lookup = SegmentLookup().fit(both, seg_labels["train"] + seg_labels["valid"])
    seg = lookup.choose(seg_labels["test"])
    T = M["test"]
    oracle = oracle_choice(T["R"])
    choices = {BASELINE: np.full(len(oracle), base), "static-default": np.zeros_like(oracle),
               "supervised-router": plain, "supervised-router-equal-cost": eq,
               "per-segment-best": seg, "per-query-oracle": oracle}
    for system, ch in choices.items():
        for metric, X_ in (("reward", T["R"]), ("quality", T["Q"]), ("tokens", T["T"])):
            rows.append(metric_row(ds, system, metric, pick(X_, ch), seed))
    for system in SYSTEMS:
        rows.extend(_delta_rows(ds, system, T, choices[system], base, oracle, seed))

    def used(ch: np.ndarray) -> dict[str, int]:
        u, c = np.unique(ch, return_counts=True)
        return {names[i]: int(k) for i, k in sorted(zip(u, c, strict=True), key=lambda x: -x[1])}

    details[ds] = {
        "n": {role: int(len(idx)) for role, (_, idx) in parts.items()},
        "splits": {role: s for role, (s, _) in parts.items()},
        "arms": names, "best_static": names[base], "token_budget": budget,
        "router": {"selection": sel.tried, "chosen": sel.best, "token_price": price,
                   "valid_reward": float(pick(M["valid"]["R"], router.choose(X["valid"], 0.0))
                                         .mean()),
                   "valid_best_static_reward": float(M["valid"]["R"][:, base].mean()),
                   "test_arms": used(plain), "test_arms_equal_cost": used(eq)},
        "segments": {"key": key, "table": {s: names[j] for s, j in lookup.table.items()},
                     "fallback": names[lookup.fallback]},
        "search_best_known": "search-best-known" in names, "train_added_from_qrels": added,
        "features_s": round(feat_s, 1), "wall_s": round(time.perf_counter() - t0, 1),
        "counters": dict(ev.counters),
    }
    print(f"[{ds}] done in {details[ds]['wall_s']}s (features {feat_s:.1f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-json", type=Path, default=SEARCH_JSON,
                    help="bench/search.py's results, whose best-known configs join the arms")
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite the markdown from the existing JSON; evaluate nothing")
    a = ap.parse_args()
    if a.render_only:
        rerender(NAME, a.quick, TITLE, markdown)
        return
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    policy = TunerSettings.defaults()
    rows: list[dict] = []
    details: dict[str, Any] = {}
    t0 = time.perf_counter()
    for ds in datasets:
        run_dataset(ds, policy, a.seed, rows, details, a.search_json)
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {
        "quick": a.quick, "wall_s": round(time.perf_counter() - t0, 1),
        "base_config": policy.base_config().model_dump(mode="json"),
        "features": list(FEATURE_NAMES),
        "search_json": str(a.search_json) if a.search_json.exists() else None,
        "reward": {"weights": policy.reward_weights.model_dump(mode="json", by_alias=True),
                   "cost_ref_tokens": policy.cost_ref_tokens},
        "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
