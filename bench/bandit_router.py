"""Does the Serve app's bandit router adapt online from feedback?

    python bench/bandit_router.py            # synthetic-choices and HotpotQA, 20 seeds
    python bench/bandit_router.py --quick    # < 2 min: synthetic-choices, 5 seeds

The router is the product's own: `serving.traffic.TrafficSplitter` in bandit mode (UCB1 or
Thompson sampling of `rl.routing.arm_bandit`, one bandit per request category), routing each
request and fed the served config's reward the way `/feedback` feeds it (`update`).
Arms: the static default and the `ARMS` − 1 configs of the routing portfolio with the best mean
quality on the valid split. Per-query rows come from `rl.routing.train.prepare` (the tuner's
evaluator: quality αF + βR in [0, 1], tokens), the arms' quality on every test query is known,
so each request's feedback is the served arm's quality on its question. A stream is
`REQUESTS` requests drawn with replacement from the test split (one seeded stream per seed);
its category is the question's `category` (synthetic-choices: its family, six; HotpotQA:
bridge / comparison), the label a client sends in `/query`.

Systems: `bandit-ucb1`, `bandit-thompson` (the router), `uniform` (the arms at random),
`valid-best` (the arm best on valid, served throughout: what deploying without a bandit
does), `best-static` and `per-category-best` (the best arm of the test stream, overall and per
category, in hindsight: upper bounds a bandit of one or per-category arms tends to).
Rows per dataset and system: `quality` and `tokens` (mean per request over the stream) and
`quality_last_quarter` (the stream's last quarter, after the bandit has learned); for the
bandits also `delta_quality` and `delta_tokens_pct` against `valid-best` (whole stream) and
`gap_closed` = (bandit − uniform) / (best-static − uniform) quality over the whole stream.
Every CI is a bootstrap 95% interval over seeds (n = seeds; each seed's stream is paired
across systems).

Targets (fixed before the first run): `bandit-ucb1` `gap_closed` ≥ 0.5 and its
`quality_last_quarter` within 0.01 of `best-static`'s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, metric_row, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.train import prepare  # noqa: E402
from serving.schemas import BanditSettings, TrafficSettings  # noqa: E402
from serving.traffic import TrafficSplitter  # noqa: E402

NAME = "bandit_router"
TITLE = "The Serve app's bandit router learning from feedback"
ARMS = 4
REQUESTS = 2000
SEEDS, QUICK_SEEDS = 20, 5
GAP_TARGET, LAST_QUARTER_MARGIN = 0.5, 0.01
BANDITS = ("ucb1", "thompson")


def run_stream(Q: np.ndarray, cats: list[str], names: list[str], algorithm: str,
               order: np.ndarray, seed: int) -> np.ndarray:
    """The arm index the bandit router served at each request of `order` (indices into the
    rows of Q, (queries × arms) quality in [0, 1]), fed each served quality as feedback."""
    router = TrafficSplitter(names[0], TrafficSettings(mode="bandit"),
                             BanditSettings(algorithm=algorithm, seed=seed), arms=names)
    served = np.empty(order.size, dtype=np.int64)
    for t, q in enumerate(order):
        d = router.route(f"r{seed}-{t}", category=cats[q])
        served[t] = names.index(d.variant)
        router.update(cats[q], d.variant, float(Q[q, served[t]]))
    return served


def dataset_rows(ds: str, seeds: int, log) -> tuple[list[dict], dict]:
    """The rows of one dataset (module docstring) and its details for `meta`."""
    settings = TunerSettings.defaults()
    tmp = tempfile.mkdtemp(prefix="bandit-router-")  # the rows stay in the tuner's cache
    prep = prepare(ds, settings, Path(tmp) / "p", max_train=None if "synthetic" in ds else 20,
                   log=log)
    qv = np.nanmean(prep.M["valid"]["Q"], axis=0)
    top = [int(j) for j in np.argsort(-qv) if j != 0][:ARMS - 1]
    arms = [0, *top]
    names = [prep.names[j] for j in arms]
    Q, T = prep.M["test"]["Q"][:, arms], prep.M["test"]["T"][:, arms]
    split, idx = prep.parts["test"]
    cats = [prep.ev.data.examples(split)[int(i)].category for i in idx]
    valid_best = int(np.argmax(qv[arms]))
    per: dict[str, dict[str, list[float]]] = {}

    def add(system: str, served: np.ndarray, order: np.ndarray) -> None:
        q, tok = Q[order, served], T[order, served]
        m = per.setdefault(system, {"quality": [], "tokens": [], "quality_last_quarter": []})
        m["quality"].append(q.mean())
        m["tokens"].append(tok.mean())
        m["quality_last_quarter"].append(q[-len(q) // 4:].mean())

    for s in range(seeds):
        rng = np.random.default_rng([s, 7])
        order = rng.integers(0, len(idx), size=REQUESTS)
        add("uniform", rng.integers(0, len(arms), size=REQUESTS), order)
        add("valid-best", np.full(REQUESTS, valid_best), order)
        add("best-static", np.full(REQUESTS, int(Q[order].mean(axis=0).argmax())), order)
        best_of = {c: int(Q[order][np.array([cats[q] == c for q in order])].mean(axis=0).argmax())
                   for c in set(cats[q] for q in order)}
        add("per-category-best", np.array([best_of[cats[q]] for q in order]), order)
        for alg in BANDITS:
            add(f"bandit-{alg}", run_stream(Q, cats, names, alg, order, s), order)
        log(f"  {ds}: seed {s + 1}/{seeds} done")
    rows = [metric_row(ds, system, metric, vals)
            for system, m in per.items() for metric, vals in m.items()]
    for alg in BANDITS:
        b, vb, u = per[f"bandit-{alg}"], per["valid-best"], per["uniform"]
        rows.append(metric_row(ds, f"bandit-{alg} - valid-best", "delta_quality",
                               np.subtract(b["quality"], vb["quality"])))
        rows.append(metric_row(ds, f"bandit-{alg} - valid-best", "delta_tokens_pct",
                               100 * (np.divide(b["tokens"], vb["tokens"]) - 1)))
        gap = np.subtract(per["best-static"]["quality"], u["quality"])
        rows.append(metric_row(ds, f"bandit-{alg}", "gap_closed",
                               np.subtract(b["quality"], u["quality"]) / gap))
    counts = {c: cats.count(c) for c in sorted(set(cats))}
    return rows, {"arms": names, "valid_best": names[valid_best], "test_queries": len(idx),
                  "categories": counts}


def _get(rows: list[dict], ds: str, system: str, metric: str) -> dict:
    return next(r for r in rows if (r["dataset"], r["system"], r["metric"]) == (ds, system,
                                                                                metric))


def markdown(rows: list[dict], details: dict, seeds: int) -> str:
    """The table per dataset and the two targets with their margins."""
    f = "{:.4f} [{:.4f}, {:.4f}]"
    out = [f"{seeds} seeds × {REQUESTS} requests per dataset; CIs: bootstrap 95% over seeds.",
           ""]
    for ds, d in details.items():
        out += [f"## {ds}", "", f"Arms: {', '.join(f'`{a}`' for a in d['arms'])} (valid-best "
                f"`{d['valid_best']}`); {d['test_queries']} test queries; categories "
                f"{d['categories']}.", "",
                "| system | quality | quality, last quarter | tokens |", "|---|---|---|---|"]
        for system in ("uniform", "valid-best", "best-static", "per-category-best",
                       *(f"bandit-{a}" for a in BANDITS)):
            cells = [_get(rows, ds, system, m) for m in ("quality", "quality_last_quarter",
                                                         "tokens")]
            out.append(f"| {system} | " + " | ".join(
                (f if r["metric"] != "tokens" else "{:.1f} [{:.1f}, {:.1f}]").format(
                    r["value"], r["ci_low"], r["ci_high"]) for r in cells) + " |")
        out.append("")
        gap = _get(rows, ds, "bandit-ucb1", "gap_closed")
        last = (_get(rows, ds, "bandit-ucb1", "quality_last_quarter")["value"]
                - _get(rows, ds, "best-static", "quality_last_quarter")["value"])
        for alg in BANDITS:
            dq = _get(rows, ds, f"bandit-{alg} - valid-best", "delta_quality")
            dt = _get(rows, ds, f"bandit-{alg} - valid-best", "delta_tokens_pct")
            out.append(f"- `bandit-{alg}` against valid-best: quality "
                       f"{f.format(dq['value'], dq['ci_low'], dq['ci_high'])}, tokens "
                       f"{dt['value']:+.1f}% [{dt['ci_low']:+.1f}, {dt['ci_high']:+.1f}]")
        out += [f"- target `gap_closed` ≥ {GAP_TARGET}: {gap['value']:.3f} "
                f"({'met' if gap['value'] >= GAP_TARGET else 'missed'}, margin "
                f"{gap['value'] - GAP_TARGET:+.3f})",
                f"- target last-quarter quality ≥ best-static − {LAST_QUARTER_MARGIN}: "
                f"{last:+.4f} ({'met' if last >= -LAST_QUARTER_MARGIN else 'missed'}, margin "
                f"{last + LAST_QUARTER_MARGIN:+.4f})", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="synthetic-choices, 5 seeds")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)

    datasets = ["synthetic-choices"] + ([] if args.quick else ["hotpotqa"])
    seeds = QUICK_SEEDS if args.quick else SEEDS
    rows, details = [], {}
    for ds in datasets:
        r, details[ds] = dataset_rows(ds, seeds, log)
        rows += r
    paths = {} if args.quick else {"hotpotqa": data_root() / "hotpotqa"}
    meta = make_meta(0, paths, {"quick": args.quick, "seeds": seeds, "requests": REQUESTS,
                                "details": details, "wall_s": time.perf_counter() - t0})
    write_results(NAME, rows, meta, TITLE, markdown(rows, details, seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
