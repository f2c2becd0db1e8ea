"""Issue 21, item 2, the second set: SmolLM2 SFT on teacher + gold answers (every gold-target
example of the baseline recipe, then every kept Qwen answer), against the gold-only SFT
baseline, end to end on HotpotQA test (the protocol of bench/generator_adaptation.py: first 100
test questions, default `RAGConfig()` top 5, `cite_concise`, greedy, 20 new tokens, fp32 on
CPU; paired bootstrap of the per-question F1). The teacher-only set is `smollm2-distilled` in
bench/results/generator_adaptation.md.

    python -m rl.adaptation.teacher --export-sets DIR           # 1. teacher.jsonl, teacher+gold.jsonl
    ragpilot train-generator sft --train-jsonl DIR/teacher+gold.jsonl ...   # 2. the model
    python bench/generator_adaptation.py --section eval --eval-n 100 --system LABEL=REF
                                                                # 3. answers
    python bench/generator_distill.py                           # 4. json + md from the part

The teacher's answers come from the committed device run (bench/results/gpu_models_raw); a
machine without the teacher store fills it from there first (`bench.gpu_models_ingest._teacher`,
which `python bench/gpu_models_ingest.py` runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

import bench.generator_adaptation as ga  # noqa: E402
from bench.common import make_meta, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402

NAME = "generator_distill"
SYSTEMS = ("smollm2-teacher-gold",)


def render(eval_n: int, commands: str | None, note: str | None) -> None:
    f = ga.PARTS / f"eval-test-{eval_n}.json"
    if not f.exists():
        raise SystemExit(f"{f} does not exist: run step 3 (module docstring) first")
    part = json.loads(f.read_text())
    missing = [s for s in (ga.BASELINE, *SYSTEMS) if s not in part["systems"]]
    if missing:
        raise SystemExit(f"the eval part has no {', '.join(missing)}: evaluate it first")
    part = {**part, "systems": {k: part["systems"][k] for k in (ga.BASELINE, *SYSTEMS)}}
    rows, md = ga.eval_rows(part)
    body = [
        "SmolLM2-135M trained from its base weights on teacher + gold answers, against the "
        f"gold-only SFT (`{ga.BASELINE}`), both with the same recipe; the same first "
        f"{part['n']} HotpotQA test questions (`bench/generator_adaptation.py` eval protocol: "
        "hybrid k=5 contexts, `cite_concise`, greedy, 20 new tokens, fp32). The issue's "
        "target (answer F1 >= 0.33 end to end) is set for `smollm2-distilled`, the "
        "teacher-only set (bench/results/generator_adaptation.md); this row is read against "
        "it too.", "", *md, "",
        "How each system was trained (its merged folder's `ragpilot_meta.json`):", "",
        *[ga._train_line(label, r.get("train") or {}) for label, r in part["systems"].items()],
        ""]
    if note:
        body += [note, ""]
    if commands:
        body += [f"Commands: {commands}", ""]
    meta = make_meta(0, {"hotpotqa": data_root() / "hotpotqa"},
                     {"part": str(f), "systems": list(part["systems"]), "commands": commands,
                      "note": note})
    write_results(NAME, rows, meta, "Distillation on teacher + gold answers (issue 21)",
                  "\n".join(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--commands", help="the commands of steps 1-3, for the md")
    ap.add_argument("--note", help="what the numbers say, for the md")
    a = ap.parse_args()
    render(a.eval_n, a.commands, a.note)


if __name__ == "__main__":
    main()
