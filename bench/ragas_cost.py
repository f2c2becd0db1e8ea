"""What the ragas adapter costs per answer, with and without its reply cache (docs/quality.md).

    python bench/ragas_cost.py           # 30 synthetic + 30 HotpotQA test answers (~2 min)
    python bench/ragas_cost.py --quick   # 8 synthetic answers (writes *.quick.*)

`rag.metrics.ragas_adapter.RagasScorer` (real ragas, four metrics: faithfulness, answer
relevancy, context precision, context recall) against the project's local OpenAI-compatible
server (`tests.support.llm_server`, the rule-based judge) on 127.0.0.1, in this process. Each
sample is a question with its first gold answer as the response and as the reference, and k = 5
contexts: its gold passages, then passages drawn from the corpus (seeded), in a seeded order.
Three modes on the same samples:

- `cache-off`: `cache: false`, ragas' own call pattern (strictness 3 question generations);
- `cache-cold`: the reply cache on, empty (a fresh SQLite file per repetition);
- `cache-warm`: the same cache again, every reply already stored.

Rows per (dataset, mode): judge calls per sample (`calls_per_sample`, and per metric), prompt
tokens per sample as the server counted them, and wall seconds per sample (median of 3
repetitions). Calls and tokens are deterministic: the repetitions must agree, and the run
fails if they do not. Seconds depend on the machine's load (the 1-minute load average is in
meta); a real LLM endpoint's latency would dominate them anyway.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, optional_data, plain_row, write_results  # noqa: E402
from rag.corpus.loaders import HOTPOTQA_FILE, load_dataset  # noqa: E402
from rag.types import Answer, Context, Example  # noqa: E402

METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
MODES = ("cache-off", "cache-cold", "cache-warm")
K = 5
REPEATS = 3


def samples(name: str, n: int, seed: int = 0) -> list[tuple[Answer, Example]]:
    """(answer, example) for the first `n` examples of `name` with an answer and gold passages
    (HotpotQA: of its test split): the gold answer over its gold passages plus seeded
    distractors, K contexts in a seeded order."""
    ds = load_dataset(name)
    examples = ds.examples
    if name == "hotpotqa":
        from rag.corpus.hygiene import resolve_split

        examples = resolve_split(ds, "test")
    rng = random.Random(seed)
    ids = list(ds.corpus.ids)
    out = []
    for e in examples:
        if not (e.answers and e.gold_passage_ids):
            continue
        chosen = [i for i in e.gold_passage_ids if i in ds.corpus][:K]
        while len(chosen) < K:
            pid = rng.choice(ids)
            if pid not in chosen:
                chosen.append(pid)
        rng.shuffle(chosen)
        ctx = tuple(Context(p.id, p.title, p.text) for p in (ds.corpus[i] for i in chosen))
        cite = 1 + next(i for i, c in enumerate(ctx) if c.id in e.gold_passage_ids)
        out.append((Answer(e.id, e.question, f"{e.answers[0]}. [{cite}]", (cite,), ctx, (), {},
                           0, 0, "bench"), e))
        if len(out) == n:
            break
    return out


def run_mode(server, encoder, items, mode: str, cache_path: str | None) -> dict:
    from rag.metrics.ragas_adapter import RagasScorer

    cfg = {"base_url": server.url, "model": "judge"}
    cfg.update({"cache": False} if mode == "cache-off" else {"cache_path": cache_path})
    scorer = RagasScorer(cfg, encoder=encoder)
    before = server.stats
    t0 = time.perf_counter()
    scorer.score_batch([a for a, _ in items], [e for _, e in items])
    secs = time.perf_counter() - t0
    after = server.stats
    u = scorer.usage
    return {"seconds": secs, "requests": after["requests"] - before["requests"],
            "prompt_tokens": after["prompt_tokens"] - before["prompt_tokens"],
            **{f"calls_{m}": u.get(m, {}).get("calls", 0) for m in METRICS}}


def measure(server, encoder, items) -> dict[str, dict]:
    """Per mode: the deterministic counts (asserted equal across repetitions) and the median
    seconds."""
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            runs = []
            for r in range(REPEATS):
                # cold: a new cache file each time; warm: the file the last cold run filled
                path = str(Path(tmp) / f"cold{r}.sqlite") if mode == "cache-cold" else \
                    str(Path(tmp) / f"cold{REPEATS - 1}.sqlite")
                runs.append(run_mode(server, encoder, items, mode, path))
            counts = [{k: v for k, v in run.items() if k != "seconds"} for run in runs]
            if any(c != counts[0] for c in counts):
                raise SystemExit(f"{mode}: calls or tokens differ between repetitions: {counts}")
            out[mode] = {**counts[0], "seconds": statistics.median(r["seconds"] for r in runs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from tests.support.llm_server import LLMServer

    from rag.encoders import Encoder

    n = 8 if args.quick else 30
    data = {"synthetic": None}
    if not args.quick:
        data.update(optional_data({"hotpotqa": HOTPOTQA_FILE}))
    if not args.quick and "hotpotqa" not in data:
        print("note: no HotpotQA here (../shared absent): synthetic only")
    encoder = Encoder.from_registry("minilm")
    rows, md = [], []
    with LLMServer() as server:
        for name in data:
            items = samples(name, n)
            label = f"{name}[:{len(items)}]/k{K}-gold-answers"
            res = measure(server, encoder, items)
            md += [f"## {name} ({len(items)} answers)", "",
                   "| mode | calls / sample | " + " | ".join(METRICS)
                   + " | prompt tokens / sample | s / sample (median of 3) |",
                   "|---|" + "---|" * (len(METRICS) + 3)]
            for mode, r in res.items():
                per = {"calls_per_sample": r["requests"] / len(items),
                       **{f"calls_per_sample_{m}": r[f"calls_{m}"] / len(items)
                          for m in METRICS},
                       "prompt_tokens_per_sample": r["prompt_tokens"] / len(items),
                       "seconds_per_sample": r["seconds"] / len(items)}
                rows += [plain_row(label, f"ragas-adapter:{mode}", k, v, len(items))
                         for k, v in per.items()]
                md.append(f"| `{mode}` | {per['calls_per_sample']:.2f} | "
                          + " | ".join(f"{per[f'calls_per_sample_{m}']:.2f}" for m in METRICS)
                          + f" | {per['prompt_tokens_per_sample']:,.0f} | "
                          f"{per['seconds_per_sample']:.3f} |")
            md.append("")
    md.append("Calls and tokens are those the server received (they equal the adapter's own "
              "count, tests/test_ragas_adapter.py); with the cache on, identical prompts share "
              "one call (ragas' 3 answer-relevancy question generations at temperature 0 are "
              "one prompt), and a warm cache makes none.")
    datasets = {k: v for k, v in data.items() if v is not None}
    meta = make_meta(0, datasets, {"k": K, "repeats": REPEATS, "judge": "rules (llm_server)",
                                   "loadavg_1m": round(os.getloadavg()[0], 2),
                                   "quick": args.quick})
    write_results("ragas_cost", rows, meta,
                  "ragas adapter: judge calls, prompt tokens and time per answer",
                  "\n".join(md))


if __name__ == "__main__":
    main()
