"""Issue 21, item 3: the device run's train preference pairs re-judged against the gold answer
by the reference-guided pointwise judge (`bench/judge_reference.py` measured it on test pairs),
and the DPO pairs that makes.

    python bench/judge_relabel.py --out DIR   # grades resume from DIR/grades.json (~1 s each)

Writes DIR/dpo_pairs_{gold,hybrid}.jsonl (for `ragpilot train-generator dpo --pairs-jsonl`) and
bench/results/judge_relabel.{json,md}: how often the new verdicts agree with the gold-F1
preference and with the device run's reference-free `judge:qwen`, and how many decisive pairs
each context mode yields (`bench.generator_prefs.relabel_pointwise`, `write_pairs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.generator_prefs as gp  # noqa: E402
from bench.common import make_meta, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402

NAME = "judge_relabel"
POINTWISE = gp.POINTWISE


def write_relabel(rows: list[dict], notes: list[str]) -> None:
    """bench/results/judge_relabel.{json,md}: the re-judged train pairs against the device
    run's verdicts and the gold-F1 preference, and the preference pairs they make."""
    table = gp.ga._rows_table(rows, dataset=True)
    body = [
        "The committed device run's (Qwen2.5-Coder-1.5B, SmolLM2-135M) answer pairs on the 500 "
        f"HotpotQA train questions (gold and hybrid contexts), re-judged here by `{POINTWISE}` "
        "(each distinct answer graded once against the gold answer, "
        "`rag.metrics.pairwise_judge.PointwiseJudgeBackend`; the higher grade wins) instead of "
        "the device run's reference-free pairwise `judge:qwen`. Agreement counts a tie as a "
        "miss, over the pairs whose gold F1 differs. `preference_pairs`: the decisive pairs "
        "written as DPO rows (`bench.gpu_models_ingest._pair_rows`).", "", *table, "",
        *[f"- {n}" for n in notes], "",
        "Command: `python bench/judge_relabel.py --out DIR` (grades resume from "
        "DIR/grades.json; the same pairs: `python bench/generator_prefs.py --section pairs "
        f"--ranker {POINTWISE} --out DIR`).", ""]
    meta = make_meta(0, {"hotpotqa": data_root() / "hotpotqa"},
                     {"ranker": POINTWISE, "raw": "bench/results/gpu_models_raw"})
    write_results("judge_relabel", rows, meta, "Train preference pairs re-judged against the "
                  "gold answer (issue 21)", "\n".join(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="pairs and grades folder")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    write_relabel(*gp.write_pairs(a.out, ranker=POINTWISE, device=a.device))


if __name__ == "__main__":
    main()
