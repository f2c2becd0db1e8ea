"""Issue 18: is a dataset's best-known config a plateau or a spike of gate noise? Its one-head
neighbours on the tuning split and the held-out split, under the point reward.

    python bench/gate_spike.py                       # MTRAG (seconds once the rows are cached)
    python bench/gate_spike.py --datasets mtrag,hotpotqa,scifact
    python bench/gate_spike.py --quick               # the first 4 neighbours (writes *.quick.*)

The best-known config of bench/results/search.json (meta.details.<dataset>.best_known) and every
config one head away in the tuner's space (`rl.kernel.space.ConfigSpace` params: each other value
of a categorical head; k and the rerank depth one and two choices either way; a continuous head
one and two grid steps either way; changes to a head that does not act in the config are the
same config and skipped), each scored on the valid (tuning) and test (held-out) splits with the
committed cost model (`bench.common.evaluator`), so the rewards equal search.json's.

Rows per dataset: the best-known's reward and gate margins on both splits; over the neighbours:
the share that pass every hard gate on valid and on test, the best neighbour reward on valid
and the share of neighbours within 99% of best-known on valid (what bench/search.py's target
asks a searcher to reach). A spike is a best-known whose neighbours mostly fail a gate it clears
by a hair, and which fails the gate itself on test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

from bench.common import (  # noqa: E402
    CONVERSATIONAL,
    RESULTS,
    SEARCH_JSON,
    evaluator,
    make_meta,
    plain_row,
    write_results,
)
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402

NAME = "gate_spike"
BOXES = ("fusion_weight", "mmr_lambda", "rerank_mix", "abstain_threshold")


def neighbours(space, config: RAGConfig) -> list[tuple[str, RAGConfig]]:
    """(label, config) for every config one head away from `config` (module docstring)."""
    p0 = space.to_params(config, complete=True)
    out, seen = [], {config.config_hash}
    for h, x in p0.items():
        if h in BOXES:
            box = space.box(h)
            vals = box.values()
            i = min(range(len(vals)), key=lambda j: abs(vals[j] - x))
            alts = [vals[j] for j in (i - 2, i - 1, i + 1, i + 2) if 0 <= j < len(vals)]
        elif h in ("k", "rerank_depth"):
            ch = list(space.choices(h))
            i = ch.index(x)
            alts = [ch[j] for j in (i - 2, i - 1, i + 1, i + 2) if 0 <= j < len(ch)]
        else:
            alts = [c for c in space.choices(h) if c != x]
        for a in alts:
            cfg = space.from_params({**p0, h: a})
            if cfg.config_hash not in seen:
                seen.add(cfg.config_hash)
                out.append((f"{h}={a}", cfg))
    return out


def _scores(ev, cfg: RAGConfig) -> dict[str, Any]:
    out = {}
    for name, split in (("valid", ev.slice.tune_split), ("test", ev.slice.holdout_split)):
        r = ev.evaluate(cfg, split)
        out[name] = {"reward": float(r.reward), "relevancy": float(r.relevancy),
                     "faithfulness": float(r.faithfulness), "cost": float(r.cost),
                     "feasible": all(v <= 0 for v in r.violations.values()),
                     "violations": {g: float(v) for g, v in r.violations.items()}}
    return out


def run(ds: str, search_json: Path, limit: int | None = None
        ) -> tuple[list[dict], dict[str, Any], list[str]]:
    from rl.kernel.settings import TunerSettings
    from rl.kernel.space import ConfigSpace

    all_details = json.loads(search_json.read_text())["meta"]["details"]
    if ds not in all_details:
        raise SystemExit(f"{search_json}: no best-known config for {ds!r} (it has "
                         f"{', '.join(sorted(all_details))}); run bench/search.py on it first")
    details = all_details[ds]
    settings = TunerSettings.defaults()
    ev, cm = evaluator(ds, settings, search_json)
    best = RAGConfig.from_dict(details["best_known"]["config"])
    space = ConfigSpace(settings, conversational=ds in CONVERSATIONAL)
    b = _scores(ev, best)
    nb = [(label, _scores(ev, cfg)) for label, cfg in neighbours(space, best)[:limit]]
    n = len(nb)
    target = 0.99 * b["valid"]["reward"]
    rows = [plain_row(f"{ds}/{s}", "best-known", "reward", b[s]["reward"], 1)
            for s in ("valid", "test")]
    rows += [plain_row(f"{ds}/{s}", "best-known", "feasible", float(b[s]["feasible"]), 1)
             for s in ("valid", "test")]
    for s in ("valid", "test"):
        for g, v in b[s]["violations"].items():
            rows.append(plain_row(f"{ds}/{s}", "best-known", f"violation_{g}", v, 1))
        rows.append(plain_row(f"{ds}/{s}", "one-head-neighbours", "share_feasible",
                              sum(x[s]["feasible"] for _, x in nb) / n, n))
    rows.append(plain_row(f"{ds}/valid", "one-head-neighbours", "max_reward",
                          max(x["valid"]["reward"] for _, x in nb), n))
    rows.append(plain_row(f"{ds}/valid", "one-head-neighbours", "share_within_99pct",
                          sum(x["valid"]["reward"] >= target for _, x in nb) / n, n))
    table = ["| config | valid reward | valid relevancy | valid feasible | test reward | "
             "test relevancy | test feasible |", "|---|---|---|---|---|---|---|"]
    for label, x in [("best-known", b), *nb]:
        table.append(f"| {label} | {x['valid']['reward']:+.4f} | {x['valid']['relevancy']:.4f} "
                     f"| {'yes' if x['valid']['feasible'] else 'no'} | "
                     f"{x['test']['reward']:+.4f} | {x['test']['relevancy']:.4f} | "
                     f"{'yes' if x['test']['feasible'] else 'no'} |")
    md = [f"## {ds}", "",
          f"Best-known `{best.config_hash}` ({details['best_known'].get('method')} seed "
          f"{details['best_known'].get('seed')}); {n} one-head neighbours. Gate violations "
          "are relative (`rl.kernel.reward.Gate.violation`; <= 0 passes).", "", *table, ""]
    return rows, {"best_known": best.config_hash, "cost_model": cm, "neighbours": n}, md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="mtrag")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--note", help="what the numbers say, for the md")
    a = ap.parse_args()
    rows, details, md = [], {}, []
    for ds in a.datasets.split(","):
        r, d, m = run(ds, SEARCH_JSON, 4 if a.quick else None)
        rows += r
        details[ds] = d
        md += m
    meta = make_meta(0, {d: data_root() / d for d in details},
                     {"quick": a.quick, "note": a.note,
                      "search_json": str(SEARCH_JSON.relative_to(RESULTS.parent.parent)),
                      "details": details})
    write_results(NAME, rows, meta, "Best-known configs: plateau or gate-noise spike (issue 18)",
                  "\n".join([__doc__.split("\n\n")[2].replace("\n", " "), "",
                             *([a.note, ""] if a.note else []), *md,
                             f"Command: `python bench/gate_spike.py --datasets {a.datasets}"
                             f"{' --quick' if a.quick else ''}`",
                             ""]))


if __name__ == "__main__":
    main()
