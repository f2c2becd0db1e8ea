"""Does the question's own embedding help the supervised router choose a config per query?

    python bench/router_embedding.py            # hotpotqa, scifact, mtrag (committed splits)
    python bench/router_embedding.py --quick    # the synthetic world, a small grid (< 2 min)

The shipped router (`select_router_cv`) sees `rl.routing.features`: retrieval scores, list
agreement, question cues and conversation flags, 42-126 scalars. Routers in the literature
(RouteLLM's BERT and matrix-factorisation routers) route on the text's embedding instead. The
dense retriever computes that embedding for every question anyway, so it costs nothing more
when serving. This study adds its first `DIMS` principal components (the base config's encoder
on its retrieval query; PCA fitted on the fitting rows only, no labels) to the features.

Only train ∪ valid is read (bench/policy.py's roles: train = the seeded subset of
`--max-train` queries, valid = the tune split); test is never opened. Outer loop: 5 folds
of train ∪ valid grouped by conversation (`rl.stats.headroom.group_folds`); each fold is held
out once, and each method is chosen on the other four by `select_router_cv` as shipped
(grouped 4-fold CV over `PARAM_GRID`, margin 0), refitted on them and scored on it:

- `cv`: the shipped features;
- `cv+emb16`: the shipped features plus 16 principal components of the query embedding.

Rows (`metric` `delta_reward`): per held-out query, the method's reward minus that of the best
static arm of the valid-role rows of the four folds (bench/router_selection.py's reference),
pooled over the five held-out folds, paired bootstrap 95% CI; and `cv+emb16 - cv`, paired.
The rule fixed before the run: adopt the embedding features if the mean of `cv+emb16 - cv`
over the datasets is above 0 and on no dataset is its CI entirely below 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cost_model_used, evaluator  # noqa: E402
from bench.headroom import matrices  # noqa: E402
from bench.policy import _features, _parts, arms, role_data  # noqa: E402
from bench.router_selection import OUTER, study_main  # noqa: E402
from rag.encoders import Encoder, encode_queries  # noqa: E402
from rag.types import conversation_of  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.features import QueryFeaturizer, conversation_views  # noqa: E402
from rl.routing.router import PARAM_GRID, arm_features, select_router_cv  # noqa: E402
from rl.stats.bootstrap import paired_bootstrap  # noqa: E402
from rl.stats.headroom import best_static, group_folds, pick  # noqa: E402

NAME = "router_embedding"
TITLE = "Routing on the question's embedding: does it help the supervised router?"
DIMS = 16
BASE, EMB = "cv", f"cv+emb{DIMS}"
METHODS = (BASE, EMB)
PAIRED = f"{EMB} - {BASE}"


def principal_components(E: np.ndarray, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, the top `dims` principal axes as rows) of the rows of `E`: fitted on the
    embeddings of the router's fitting rows only."""
    mu = E.mean(axis=0)
    _, _, vt = np.linalg.svd(E - mu, full_matrices=False)
    return mu, vt[:dims]


def project(E: np.ndarray, pcs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    mu, axes = pcs
    return ((E - mu) @ axes.T).astype(np.float32)


def embeddings(ev, policy: TunerSettings, examples) -> np.ndarray:
    """The base config's encoder on each example's retrieval query (what its dense retriever
    embeds when serving), L2-normalised."""
    cfg = policy.base_config()
    feat = QueryFeaturizer(ev.memo, cfg)
    texts = [feat.retrieval_query(e.question, tuple(e.history or ())) for e in examples]
    return np.asarray(encode_queries(Encoder.from_registry(cfg.encoder), texts),
                      dtype=np.float32)


def run_dataset(ds: str, seed: int, max_train: int | None, quick: bool
                ) -> tuple[list[dict], dict]:
    t0 = time.perf_counter()
    policy = TunerSettings.defaults()
    ev, source = evaluator(ds, policy)
    views = conversation_views(ev.data.dataset.examples)  # as bench/policy.py: MTRAG's views
    configs = arms(ds, policy, formulations=views)
    parts = {r: p for r, p in _parts(ev, seed, max_train).items() if r != "test"}
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M, X, ex = role_data(ev, parts, full, _features(ev, policy, [parts], views))
    desc = arm_features([c for _, c in configs])
    Xa = np.vstack([X["train"], X["valid"]])
    Ea = embeddings(ev, policy, ex["train"] + ex["valid"])
    Ra, Ta = (np.vstack([M["train"][k], M["valid"][k]]) for k in ("R", "T"))
    role = np.array([0] * len(X["train"]) + [1] * len(X["valid"]))
    groups = [conversation_of(e) for e in ex["train"] + ex["valid"]]
    grid = PARAM_GRID[:2] if quick else PARAM_GRID
    outer = group_folds(groups, OUTER, seed)
    got: dict[str, list[np.ndarray]] = {m: [] for m in (*METHODS, "reference")}
    folds = []
    for o in range(OUTER):
        held, rest = outer == o, outer != o
        va = rest & (role == 1)
        ref = best_static(Ra[va])
        g_rest = [g for g, r in zip(groups, rest, strict=True) if r]
        pcs = principal_components(Ea[rest], DIMS)
        Xe = np.hstack([Xa, project(Ea, pcs)])
        chosen = {}
        for m, Xm in ((BASE, Xa), (EMB, Xe)):
            router, sel = select_router_cv(Xm[rest], Ra[rest], Ta[rest], g_rest, grid=grid,
                                           margins=(0.0,), seed=seed, arms=desc)
            got[m].append(pick(Ra[held], router.choose(Xm[held], 0.0)))
            chosen[m] = {k: sel.tried[sel.best][k]
                         for k in ("max_iter", "max_leaf_nodes", "shrink", "pooled",
                                   "cv_reward")}
        got["reference"].append(Ra[held][:, ref])
        folds.append({"held": int(held.sum()), "valid_best_static": configs[ref][0],
                      "chosen": chosen})
        print(f"[{ds}] outer fold {o + 1}/{OUTER}: {folds[-1]}", flush=True)
    cat = {k: np.concatenate(v) for k, v in got.items()}
    rows = []
    for system, a, b in ((BASE, "reference", BASE), (EMB, "reference", EMB),
                         (PAIRED, BASE, EMB)):
        r = paired_bootstrap(cat[a], cat[b], seed=seed)
        rows.append({"dataset": ds, "system": system, "metric": "delta_reward",
                     "value": r.mean_diff, "ci_low": r.ci_low, "ci_high": r.ci_high,
                     "n": r.n})
    details = {"n": {r: int(len(M[r]["R"])) for r in parts}, "arms": len(configs),
               "features": int(Xa.shape[1]), "embedding_dim": int(Ea.shape[1]),
               "dims": DIMS, "grid": len(grid), "folds": folds,
               "cost_model": cost_model_used(ev, source),
               "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"[{ds}] done in {details['wall_s']}s", flush=True)
    return rows, details


def verdict(rows: list[dict], datasets: list[str]) -> tuple[float, list[str], bool]:
    """(mean of the paired rows over `datasets`, the datasets where its CI is below 0,
    whether the rule fixed before the run adopts the embedding features)."""
    paired = [next(r for r in rows if r["dataset"] == ds and r["system"] == PAIRED)
              for ds in datasets]
    mean = float(np.mean([r["value"] for r in paired]))
    worse = [r["dataset"] for r in paired if r["ci_high"] < 0]
    return mean, worse, mean > 0 and not worse


def markdown(meta: dict, rows: list[dict]) -> str:
    def cell(ds: str, m: str) -> str:
        r = next(r for r in rows if r["dataset"] == ds and r["system"] == m)
        return f"{r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"

    dss = list(meta["details"])
    det = meta["details"]
    out = [__doc__.split("\n\n", 2)[2].strip(), "",
           "| system | " + " | ".join(
               f"{ds} (n {sum(f['held'] for f in det[ds]['folds'])}, "
               f"{det[ds]['arms']} arms, {det[ds]['features']} features)" for ds in dss)
           + " | mean |",
           "|---|" + "---|" * (len(dss) + 1)]
    for m in (*METHODS, PAIRED):
        vals = [next(r["value"] for r in rows if r["dataset"] == ds and r["system"] == m)
                for ds in dss]
        out.append(f"| {m} | " + " | ".join(cell(ds, m) for ds in dss)
                   + f" | {float(np.mean(vals)):+.4f} |")
    mean, worse, adopt = verdict(rows, dss)
    out += ["", f"Mean of `{PAIRED}` over the datasets: {mean:+.4f}; CI below 0 on: "
                f"{', '.join(worse) or 'none'}. Rule: "
                + ("**adopted**." if adopt else "**not adopted**: the shipped features stay."),
            ""]
    for ds in dss:
        f = det[ds]["folds"]
        for m in METHODS:
            picks = [(x["chosen"][m]["max_iter"], x["chosen"][m]["max_leaf_nodes"],
                      x["chosen"][m]["shrink"], x["chosen"][m]["pooled"]) for x in f]
            out.append(f"- {ds} `{m}`: CV chose (max_iter, leaves, shrink, pooled) {picks}.")
    return "\n".join(out)


def main() -> None:
    study_main(__doc__, run_dataset, NAME, TITLE, markdown, dims=DIMS)

if __name__ == "__main__":
    main()
