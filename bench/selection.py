"""Does episode-level context selection (src/rl/selection, docs/selection.md: BC, RAFT, PPO)
pick better passages than retrieve-then-rerank with the same passage budget?

    python bench/selection.py           # full: HotpotQA + MTRAG, ablations (sizes below)
    python bench/selection.py --quick   # < 2 min: small splits, no PPO, a reduced ablation

HotpotQA (configs/splits/hotpotqa.json): train on `train`, select models on `valid`, report on
`test` (the holdout): supporting-passage F1 / precision / recall of the selected set, answer F1
of the extractive reader on it, redundancy, passages used, selection latency; BC, BC+RAFT and
BC+RAFT+PPO against retrieve-then-rerank with the same passage budget, paired bootstrap 95% CI
(rl.stats.bootstrap.paired_bootstrap) of candidate - baseline. MTRAG (configs/splits/mtrag.json): answer
F1, faithfulness (QualityScorer), support F1, same comparison, plus the rewrite ablation.
Ablations (HotpotQA): K, MMR lambda (MMR rule and shaping lambda), reranker, shaping.
Everything runs in-process; PPO uses a local Ray runtime. Writes bench/results/selection.json
and .md (`--quick`: selection.quick.*).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _k, _v in {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(_k, _v)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.selection.ablate import Sizes, run_dataset  # noqa: E402
from rl.selection.config import SelectionConfig  # noqa: E402

QUICK = Sizes(train=50, valid=20, test=30, ks=(20, 50), lambdas=(0.2, 0.8), ppo_iterations=0,
              raft_rounds_ablation=1, faithfulness=True)
FULL = Sizes(train=None, valid=150, test=None, ks=(20, 50, 100), lambdas=(0.2, 0.4, 0.6, 0.8),
             ppo_iterations=None, raft_rounds_ablation=1, faithfulness=True)
MTRAG_QUICK = Sizes(train=40, valid=20, test=30, ppo_iterations=0)
MTRAG_FULL = Sizes(train=None, valid=100, test=None, ppo_iterations=None)


def _fmt(v) -> str:
    return "" if v is None else f"{v:.3f}"


def markdown(rows: list[dict], info: dict) -> str:
    out = []
    for ds in ("hotpotqa", "mtrag"):
        dr = [r for r in rows if r["dataset"] == ds]
        if not dr:
            continue
        out.append(f"## {ds} (test split; n per row)\n")
        main = [r for r in dr if not r["system"].startswith("ablation:") and " - " not in
                r["system"]]
        systems = list(dict.fromkeys(r["system"] for r in main))
        metrics = list(dict.fromkeys(r["metric"] for r in main))
        out.append("| system | " + " | ".join(metrics) + " |")
        out.append("|---|" + "---|" * len(metrics))
        for s in systems:
            vals = {r["metric"]: r for r in main if r["system"] == s}
            out.append(f"| {s} | " + " | ".join(
                f"{vals[m]['value']:.3f}" if m in vals else "" for m in metrics) + " |")
        out.append("\nPaired differences (candidate - retrieve-then-rerank), bootstrap 95% CI:\n")
        out.append("| comparison | metric | mean | ci_low | ci_high | n |")
        out.append("|---|---|---|---|---|---|")
        for r in dr:
            if " - " in r["system"]:
                out.append(f"| {r['system']} | {r['metric']} | {r['value']:.4f} | "
                           f"{_fmt(r['ci_low'])} | {_fmt(r['ci_high'])} | {r['n']} |")
        abl = [r for r in dr if r["system"].startswith("ablation:")]
        i = info.get(ds, {})
        # arms that could not run (e.g. no cross-encoder registered) are listed, never dropped
        notes = i.get("ablation_notes") or {}
        if abl or notes:
            out.append("\nAblations (test split):\n")
            am = list(dict.fromkeys(r["metric"] for r in abl)) or ["value"]
            lines: list[tuple[str, list[str]]] = []
            for s in dict.fromkeys(r["system"] for r in abl):
                vals = {r["metric"]: r for r in abl if r["system"] == s}
                lines.append((s.removeprefix("ablation:"),
                              [f"{vals[m]['value']:.3f}" if m in vals else "" for m in am]))
            for what in notes:  # after the rows of the same ablation (`reranker=...`)
                group = what.split("=")[0] + "="
                at = max((n + 1 for n, (k, _) in enumerate(lines) if k.startswith(group)),
                         default=len(lines))
                lines.insert(at, (what, ["not run"] + [""] * (len(am) - 1)))
            out.append("| ablation | " + " | ".join(am) + " |")
            out.append("|---|" + "---|" * len(am))
            out += [f"| {k} | " + " | ".join(v) + " |" for k, v in lines]
            if notes:
                out.append("")
                out += [f"- `{what}`: {why}" for what, why in notes.items()]
        out.append(f"\nn = {i.get('n')}; pool build p50 {i.get('pool_build_ms_p50', 0):.1f} ms "
                   f"(features from memoised retrieval); reward model used: "
                   f"{i.get('reward_model_used')}\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--datasets", default="hotpotqa,mtrag")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cfg = SelectionConfig.load()
    t0 = time.perf_counter()
    rows: list[dict] = []
    info: dict = {}
    for ds in args.datasets.split(","):
        if ds == "hotpotqa":
            sizes = QUICK if args.quick else FULL
        elif ds == "mtrag":
            sizes = MTRAG_QUICK if args.quick else MTRAG_FULL
        else:
            print(f"error: --datasets: unknown dataset {ds!r}", file=sys.stderr)
            return 2
        r, i = run_dataset(ds, cfg, sizes, ablations=ds == "hotpotqa")
        rows += r
        info[ds] = i
        print(f"[{ds}] done at {time.perf_counter() - t0:.0f} s", flush=True)
    root = data_root()
    meta = make_meta(cfg.seed, {"hotpotqa": root / "hotpotqa",
                                "mtrag": root / "mtrag" / "mtragun-human" / "generation_tasks"},
                     {"quick": args.quick, "config": cfg.model_dump(mode="json"),
                      "info": info, "seconds": time.perf_counter() - t0,
                      "runner": "in-process (PPO on a local Ray runtime)"})
    write_results("selection", rows, meta, "Episode-level context selection",
                  markdown(rows, info))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
