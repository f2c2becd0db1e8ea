"""Do the packaged models run on a GPU, and how well? Qwen2.5-Coder-1.5B and SmolLM2-135M on
transformers in bf16 (`make_generator(name, device="cuda")`) answering HotpotQA test questions
(answer F1, EM, citation precision with 95% CIs, the paired F1 difference, seconds per answer),
the Qwen pairwise judge read from its next-token distribution (`LogprobJudgeBackend`: position
bias and agreement with the gold-F1 preference, under the order swap), and the
nomic-embed-text-v1.5 port on CUDA (`Encoder.from_registry(name, device="cuda")`: minimum
cosine to the CPU port's vectors, SciFact index build seconds).

The device machine has neither this project's index stack (tantivy, FAISS) nor a network, so
the retrieval runs here and the models there:

    python bench/gpu_models.py prepare     # here: .gpu_cargo/jobs.json.gz (+ nomic_ref.json)
    python bench/gpu_models.py assemble    # device: model files from .gpu_cargo/pieces
    RAGPILOT_BENCH_RESULTS=$OUT python bench/gpu_models.py run   # device: the results

`prepare` builds every input with the project's own code: the first 300 HotpotQA valid and
test questions of configs/splits/hotpotqa.json with the default retrieval's top 5
(`RAGConfig()`, hybrid k=5), the extractive reader's test answers, and the CPU port's vectors
of 16 SciFact abstracts. `run` generates, judges, embeds and scores on the device and writes
bench/results/gpu_models.{json,md} itself (into $RAGPILOT_BENCH_RESULTS, which comes back as
$OUT: copy the two files into bench/results/); nothing is re-derived later from raw outputs.
`assemble` rebuilds model files that travelled as one byte stream cut in pieces (a call
carries at most 64 MiB beside the working tree): `.gpu_cargo/pieces/pNN` and
`.gpu_cargo/pieces.json` (offset, size and sha256 of each file), into the ragpilot cache.
`run` on a machine without CUDA is refused (exit 2); `--quick` runs the same code on the CPU
with 10 questions per set and writes gpu_models.quick.* (tests/test_gpu_models.py registers a
tiny model under both names through $RAGPILOT_MODELS).

Choices fixed before the committed run (not tuned on test): Qwen's prompt for the test rows is
the one of {cite_concise, plain} with the higher answer F1 on the valid questions; greedy
decoding, 32 new tokens; the judge sees the question, the passages (400 characters each) and
two answers, in both orders.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

# the repository and its src/ on the path: the device machine has no install of this project
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    make_meta,
    metric_row,
    optional_data,
    parser,
    plain_row,
    write_results,
)

QWEN, SMOL, NOMIC = "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", "nomic-embed-text-v1.5"
PROMPTS = ("cite_concise", "plain")
MAX_NEW, JUDGE_CHARS, N_FULL, N_QUICK = 32, 400, 300, 10
TEST_DS = "hotpotqa/test/hybrid-k5"
PAIRS_DS = "hotpotqa/test/answer-pairs (gpu logprob)"


def _write_gz(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(obj, f)


def _read_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------- prepare (CPU)
def prepare(cargo: Path, n: int) -> None:
    """cargo/jobs.json.gz: {"sets": {valid, test: [question rows with their top-5 contexts and
    gold positions]}, "extractive": {qid: answer}}; cargo/nomic_ref.json: CPU port vectors."""
    from rag.config import RAGConfig
    from rag.corpus.hygiene import load_split
    from rag.corpus.loaders import data_root, load_hotpotqa
    from rag.generation.extractive import ExtractiveReader
    from rag.indexset import IndexSet
    from rag.models import cache_dir
    from rag.pipeline import Pipeline

    data = load_hotpotqa(data_root() / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl",
                         pooled=True)
    root = cache_dir() / "bench" / f"hotpotqa-{data.corpus.fingerprint()}"
    idx = IndexSet.open(root) if (root / "corpus.jsonl").exists() else IndexSet.create(
        data.corpus, root, manifest={"dataset": "hotpotqa"})
    pipe, reader = Pipeline(idx, RAGConfig()), ExtractiveReader()
    split, by_id = load_split("hotpotqa"), {e.id: e for e in data.examples}
    sets, extractive = {}, {}
    for name in ("valid", "test"):
        rows = []
        for i, qid in enumerate(split.ids(name)[:n], 1):
            e = by_id[qid]
            _, ctxs, _ = pipe.retrieve(e.question)
            gold = set(e.gold_passage_ids)
            rows.append({"id": e.id, "question": e.question, "answers": list(e.answers),
                         "contexts": [{"id": c.id, "title": c.title, "text": c.text,
                                       "score": float(c.score)} for c in ctxs],
                         "gold_positions": [k for k, c in enumerate(ctxs, 1) if c.id in gold]})
            if name == "test":
                extractive[e.id] = reader.generate(e.question, list(ctxs), "cite_concise").text
            if i % 50 == 0:
                print(f"[prepare] {name}: {i}/{n}", flush=True)
        sets[name] = rows
    _write_gz(cargo / "jobs.json.gz", {"sets": sets, "extractive": extractive,
                                       "created": time.strftime("%Y-%m-%dT%H:%M:%SZ")})
    _nomic_reference(cargo)
    print(f"[prepare] wrote {cargo / 'jobs.json.gz'}", flush=True)


def _nomic_reference(cargo: Path) -> None:
    """The CPU port's vectors of 16 SciFact abstracts, which the device's vectors must match."""
    from rag.corpus.loaders import data_root, load_beir
    from rag.encoders import Encoder, encode_documents
    from rag.errors import RagError

    try:
        enc = Encoder.from_registry(NOMIC)
    except RagError as exc:
        print(f"[prepare] nomic reference skipped ({exc})", flush=True)
        return
    docs = list(load_beir(data_root() / "scifact", "test").corpus)[:16]
    texts = [f"{p.title}. {p.text}" if p.title else p.text for p in docs]
    vecs = encode_documents(enc, texts)
    (cargo / "nomic_ref.json").write_text(json.dumps({"texts": texts, "vectors": vecs.tolist()}))


# ----------------------------------------------------------------------------- assemble (device)
def assemble(pieces: Path, manifest: Path, cache: Path) -> None:
    """Cut each file of `manifest` out of the byte stream in `pieces` (pNN files of
    `piece_bytes` each) into `cache/<dest>`; a file with a missing piece is skipped and one
    whose bytes do not hash to its sha256 is deleted, each said on stdout."""
    import hashlib

    man = json.loads(manifest.read_text())
    step = man["piece_bytes"]
    have = {int(p.name[1:]) for p in pieces.glob("p[0-9][0-9]")}
    for f in man["files"]:
        first, last = f["offset"] // step, (f["offset"] + f["size"] - 1) // step
        missing = [k for k in range(first, last + 1) if k not in have]
        if missing:
            print(f"[assemble] {f['key']}: pieces {missing} missing; skipped", flush=True)
            continue
        dest = cache / f["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with dest.open("wb") as out:
            pos, end = f["offset"], f["offset"] + f["size"]
            while pos < end:
                k = pos // step
                with (pieces / f"p{k:02d}").open("rb") as src:
                    src.seek(pos - k * step)
                    buf = src.read(min(end, (k + 1) * step) - pos)
                out.write(buf)
                h.update(buf)
                pos += len(buf)
        ok = h.hexdigest() == f["sha256"]
        print(f"[assemble] {f['key']}: {dest} {f['size']} bytes, sha256 "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)
        if not ok:
            dest.unlink()


# ----------------------------------------------------------------------------- run (device)
def _contexts(row):
    from rag.types import Context

    return [Context(c["id"], c["title"], c["text"], c["score"]) for c in row["contexts"]]


def _score(text: str, citations, row) -> tuple[float, float, float]:
    """(answer F1, EM, citation precision against the gold positions; 0 when nothing cited)."""
    from rag.metrics.qa import best_em_f1

    em, f1, _, _ = best_em_f1(text, row["answers"])
    cited, gold = set(citations), set(row["gold_positions"])
    return f1, em, (len(cited & gold) / len(cited) if cited else 0.0)


def _answer(gen, rows, prompt_id, stages, key) -> list:
    t0 = time.perf_counter()
    out = gen.generate_batch([r["question"] for r in rows], [_contexts(r) for r in rows],
                             prompt_id, MAX_NEW, 0.0)
    stages[key] = round((time.perf_counter() - t0) / max(1, len(rows)), 4)
    print(f"[run] {key}: {len(rows)} answers, {stages[key]} s each", flush=True)
    return out


def _generation(device, sets, rows, notes, stages):
    """Qwen (prompt chosen on valid) and SmolLM2 on the test questions, rows appended to
    `rows`. Returns (the Qwen generator, which judges next; {system: its `cite_concise` test
    answers}, the answers the judge compares)."""
    import numpy as np

    from rag.generation.factory import make_generator

    valid, test = sets["valid"], sets["test"]
    texts, per, qwen = {}, {}, None
    for label, name in (("qwen2.5-coder-1.5b", QWEN), ("smollm2-135m", SMOL)):
        t0 = time.perf_counter()
        gen = make_generator(name, device=device, cache=False)
        rows.append(plain_row("hotpotqa", label, "gpu_load_s", time.perf_counter() - t0, 1))
        chosen = "cite_concise"
        if label.startswith("qwen"):
            f1 = {}
            for p in PROMPTS:
                got = _answer(gen, valid, p, stages, f"{label}/valid/{p}")
                f1[p] = [_score(g.text, g.citations, r)[0] for g, r in zip(got, valid,
                                                                            strict=True)]
                rows.append(metric_row("hotpotqa/valid/hybrid-k5", f"{label}:{p}", "answer_f1",
                                       f1[p]))
            chosen = max(PROMPTS, key=lambda p: (np.mean(f1[p]), p == "cite_concise"))
            notes.append(f"Qwen's test prompt: `{chosen}` (higher valid answer F1).")
        for prompt in dict.fromkeys((chosen, "cite_concise")):
            system = label if prompt == chosen else f"{label}:{prompt}"
            got = _answer(gen, test, prompt, stages, f"{label}/test/{prompt}")
            s = np.array([_score(g.text, g.citations, r) for g, r in zip(got, test, strict=True)])
            rows.append(metric_row(TEST_DS, system, "answer_f1", s[:, 0]))
            rows.append(metric_row(TEST_DS, system, "em", s[:, 1]))
            rows.append(plain_row(TEST_DS, system, "gpu_s_per_answer",
                                  stages[f"{label}/test/{prompt}"], len(test)))
            if prompt == "cite_concise":
                rows.append(metric_row(TEST_DS, system, "cite_precision", s[:, 2]))
                texts[label] = [g.text for g in got]
            if prompt == chosen:
                per[label] = s[:, 0]
        if label.startswith("qwen"):
            qwen = gen
    rows.append(metric_row(TEST_DS, "qwen2.5-coder-1.5b - smollm2-135m", "answer_f1_diff",
                           per["qwen2.5-coder-1.5b"] - per["smollm2-135m"]))
    return qwen, texts


def _judge(qwen, test, texts, extractive, rows, stages) -> None:
    """Order-swapped log-prob verdicts on the test answer pairs (Qwen / SmolLM2 / extractive),
    with and without the passages: position bias, tie rate, agreement with gold F1."""
    from rag.metrics.judge import PairwiseJudge
    from rag.metrics.pairwise_judge import LogprobJudgeBackend
    from rag.metrics.qa import best_em_f1

    cands = {**texts, "extractive": [extractive.get(r["id"]) for r in test]}
    names = ["qwen2.5-coder-1.5b", "smollm2-135m", "extractive"]
    items, gold = [], []
    for i, r in enumerate(test):
        for a, b in ((0, 1), (0, 2), (1, 2)):
            ta, tb = cands[names[a]][i], cands[names[b]][i]
            if ta is None or tb is None or ta.strip().lower() == tb.strip().lower():
                continue
            items.append((r["question"], _contexts(r), ta, tb))
            gold.append(r["answers"])
    for with_ctx, system in ((False, "judge:qwen"), (True, "judge:qwen+passages")):
        backend = LogprobJudgeBackend(qwen.choice_logprobs, qwen.fingerprint,
                                      with_contexts=with_ctx, context_chars=JUDGE_CHARS)
        t0 = time.perf_counter()
        res = PairwiseJudge(backend).compare_batch(items) if items else []
        stages[f"{system}/pairs"] = round(time.perf_counter() - t0, 2)
        f1 = [(best_em_f1(it[2], g)[1], best_em_f1(it[3], g)[1])
              for it, g in zip(items, gold, strict=True)]
        rows.append(metric_row(PAIRS_DS, system, "position_bias", [
            float(r.forward != r.backward and "tie" not in (r.forward, r.backward)) for r in res]))
        rows.append(metric_row(PAIRS_DS, system, "tie_rate", [float(r.winner == "tie")
                                                               for r in res]))
        rows.append(metric_row(PAIRS_DS, system, "agreement_with_f1_preference", [
            float(r.winner == ("A" if a > b else "B")) for r, (a, b) in zip(res, f1, strict=True)
            if abs(a - b) > 1e-9]))


def _nomic(cargo: Path, device: str, rows, notes) -> None:
    import numpy as np

    from rag.corpus.loaders import data_root, load_beir
    from rag.encoders import Encoder, encode_documents
    from rag.index.dense import embed_corpus

    ref = json.loads((cargo / "nomic_ref.json").read_text())
    enc = Encoder.from_registry(NOMIC, device=device)
    v = encode_documents(enc, ref["texts"])
    cos = float(np.min(np.sum(v * np.asarray(ref["vectors"], dtype=np.float32), axis=1)))
    rows.append(plain_row("scifact/test", "dense-nomic", "min_cosine_gpu_vs_cpu", cos,
                          len(ref["texts"])))
    if cos < 0.9999:  # the shared fingerprint would be a lie: build nothing with these vectors
        notes.append(f"nomic: min cosine {cos:.6f} < 0.9999 against the CPU port; no index")
        return
    corpus = load_beir(data_root() / "scifact", "test").corpus
    t0 = time.perf_counter()
    embed_corpus(corpus, enc, batch_size=32)
    rows.append(plain_row("scifact/test", "dense-nomic", "gpu_index_build_s",
                          time.perf_counter() - t0, len(corpus)))


def run(cargo: Path, quick: bool) -> None:
    """The device step: every stage scored here and written as bench/results/gpu_models.*.
    Exit 2 without CUDA unless `quick` (the same code on CPU)."""
    import torch
    import transformers

    if not torch.cuda.is_available() and not quick:
        print("gpu_models run: no CUDA device here (--quick runs the same code on the CPU)",
              file=sys.stderr)
        sys.exit(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    jobs = _read_gz(cargo / "jobs.json.gz")
    n = N_QUICK if quick else N_FULL
    sets = {k: v[:n] for k, v in jobs["sets"].items()}
    rows, notes, stages = [], [], {}
    qwen, texts = _generation(device, sets, rows, notes, stages)
    _judge(qwen, sets["test"], texts, jobs["extractive"], rows, stages)
    del qwen
    if (cargo / "nomic_ref.json").exists():
        _nomic(cargo, device, rows, notes)
    else:
        notes.append("nomic: not run (no nomic_ref.json in the cargo)")
    info = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20)
            if device == "cuda" else None, "jobs_created": jobs.get("created"),
            "heavy_modules_imported": sorted(m for m in ("ray", "tantivy", "faiss", "mlflow")
                                             if m in sys.modules)}
    meta = make_meta(0, optional_data({"hotpotqa": "hotpotqa", "scifact": "scifact"}),
                     {"quick": quick, "device_run": info, "seconds": stages, "notes": notes,
                      "models": [QWEN, SMOL, NOMIC]})
    body = ["Device: " + ", ".join(f"{k} {v}" for k, v in info.items()
                                   if k != "heavy_modules_imported"), "",
            "| dataset | system | metric | value | 95% CI | n |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = "" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        body.append(f"| {r['dataset']} | {r['system']} | {r['metric']} | {r['value']:.4g} | "
                    f"{ci} | {r['n']} |")
    body += ["", *[f"- {x}" for x in notes]]
    write_results("gpu_models", rows, meta, "Packaged models on a lent GPU", "\n".join(body))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("step", choices=["prepare", "assemble", "run"])
    ap.add_argument("--cargo", type=Path, default=Path(".gpu_cargo"),
                    help="the folder that travels to the device (jobs file, pieces)")
    a = ap.parse_args()
    if a.step == "prepare":
        prepare(a.cargo, N_QUICK if a.quick else N_FULL)
    elif a.step == "assemble":
        from rag.models import cache_dir

        assemble(a.cargo / "pieces", a.cargo / "pieces.json", cache_dir())
    else:
        run(a.cargo, a.quick)


if __name__ == "__main__":
    main()
