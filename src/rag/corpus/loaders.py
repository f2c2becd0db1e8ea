"""Dataset loaders: BEIR, HotpotQA (Hugging Face JSONL or the official JSON list), MTRAG
generation tasks, plain JSONL, and the generated synthetic world.

Each returns a `Dataset` (corpus + examples + the source files with sha256). Parse errors name
the file and the 1-based line (DataError); a missing file is a DataError too.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.corpus.store import Corpus
from rag.errors import DataError
from rag.types import Example, Passage


@dataclass(frozen=True)
class Dataset:
    name: str
    corpus: Corpus
    examples: tuple[Example, ...]
    sources: dict[str, str] = field(default_factory=dict)  # path -> sha256

    def manifest_dict(self) -> dict[str, Any]:
        return {"dataset": self.name, "inputs": [{"path": p, "sha256": s}
                                                 for p, s in sorted(self.sources.items())],
                "passages": len(self.corpus), "examples": len(self.examples)}


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_root() -> Path:
    """$RAGPILOT_DATA, else the nearest `shared/datasets` beside a parent of the cwd or code."""
    env = os.environ.get("RAGPILOT_DATA")
    if env:
        return Path(env)
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in [start, *start.parents]:
            cand = parent.parent / "shared" / "datasets"
            if cand.is_dir():
                return cand
    raise DataError("RAGPILOT_DATA", "no dataset root found: set RAGPILOT_DATA to the folder "
                                     "holding hotpotqa/, scifact/, mtrag/")


def _exists(path: Path) -> Path:
    if not path.exists():
        raise DataError(str(path), "file does not exist")
    return path


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-empty line; a bad line raises DataError(line)."""
    path = _exists(Path(path))
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(str(path), f"malformed JSON: {exc.msg}", line=n) from None
            if not isinstance(obj, dict):
                raise DataError(str(path), "expected a JSON object", line=n)
            yield n, obj


def _field(obj: dict, key: str, path: Path, line: int | None):
    if key not in obj:
        raise DataError(str(path), f"missing field {key!r}", line=line)
    return obj[key]


# ---- BEIR ---------------------------------------------------------------------------------
def load_beir(directory: str | Path, split: str = "test") -> Dataset:
    d = Path(directory)
    corpus_path, q_path = d / "corpus.jsonl", d / "queries.jsonl"
    qrels_path = d / "qrels" / f"{split}.tsv"
    passages = [Passage(str(_field(o, "_id", corpus_path, n)), _field(o, "text", corpus_path, n),
                        o.get("title", "") or "") for n, o in iter_jsonl(corpus_path)]
    queries = {str(_field(o, "_id", q_path, n)): _field(o, "text", q_path, n)
               for n, o in iter_jsonl(q_path)}
    qrels: dict[str, dict[str, int]] = {}
    with _exists(qrels_path).open() as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if n == 1 and row and not row[-1].strip().lstrip("-").isdigit():
                continue  # header
            if len(row) < 3:
                raise DataError(str(qrels_path), "expected query-id, corpus-id, score", line=n)
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    examples = []
    for qid, rel in qrels.items():
        if qid not in queries:
            raise DataError(str(qrels_path), f"query {qid!r} is not in queries.jsonl")
        examples.append(Example(id=qid, question=queries[qid], qrels=rel,
                                gold_passage_ids=tuple(p for p, g in rel.items() if g > 0),
                                category=split))
    return Dataset(d.name, Corpus(passages), tuple(examples),
                   {str(p): sha256_file(p) for p in (corpus_path, q_path, qrels_path)})


# ---- HotpotQA -----------------------------------------------------------------------------
def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "p"


def _hotpot_records(path: Path) -> Iterator[tuple[int | None, dict]]:
    with _exists(path).open(encoding="utf-8") as f:
        head = f.read(64).lstrip()
    if head.startswith("["):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(str(path), f"malformed JSON: {exc.msg}", line=exc.lineno) from None
        for rec in data:
            yield None, rec
    else:
        yield from iter_jsonl(path)


def load_hotpotqa(path: str | Path, pooled: bool = True) -> Dataset:
    """Paragraphs become passages (title, sentences joined; metadata keeps the sentences).
    pooled=True: one deduplicated corpus over all examples (ids: title slug + text hash)."""
    path = Path(path)
    passages: dict[str, Passage] = {}
    examples = []
    for n, rec in _hotpot_records(path):
        qid = str(rec.get("id") or rec.get("_id") or "")
        if not qid:
            raise DataError(str(path), "missing field 'id'", line=n)
        ctx = _field(rec, "context", path, n)
        sf = _field(rec, "supporting_facts", path, n)
        if isinstance(ctx, dict):  # Hugging Face layout
            pairs = list(zip(ctx["title"], ctx["sentences"], strict=True))
            facts = list(zip(sf["title"], sf["sent_id"], strict=True))
        else:  # official list layout
            pairs = [(t, s) for t, s in ctx]
            facts = [(t, int(i)) for t, i in sf]
        title_to_id = {}
        for title, sents in pairs:
            text = " ".join(s.strip() for s in sents)
            digest = hashlib.sha1((title + "\x1f" + text).encode()).hexdigest()[:8]
            pid = f"{_slug(title)}-{digest}"
            if not pooled:
                pid = f"{qid}:{pid}"
            passages.setdefault(pid, Passage(pid, text, title, {"sentences": list(sents)}))
            title_to_id[title] = pid
        gold_titles = tuple(dict.fromkeys(t for t, _ in facts))
        examples.append(Example(
            id=qid, question=_field(rec, "question", path, n),
            answers=(str(_field(rec, "answer", path, n)),),
            supporting_facts=tuple((t, int(i)) for t, i in facts), gold_titles=gold_titles,
            gold_passage_ids=tuple(title_to_id[t] for t in gold_titles if t in title_to_id),
            category=rec.get("type") or "default", metadata={"level": rec.get("level")}))
    return Dataset("hotpotqa", Corpus(passages.values()), tuple(examples),
                   {str(path): sha256_file(path)})


# ---- MTRAG ---------------------------------------------------------------------------------
def load_mtrag(path: str | Path) -> Dataset:
    """MTRAG generation tasks: gold passages inline; history = previous turns."""
    path = Path(path)
    passages: dict[str, Passage] = {}
    examples = []
    for n, rec in iter_jsonl(path):
        turns = _field(rec, "input", path, n)
        if not turns:
            raise DataError(str(path), "empty 'input'", line=n)
        ids = []
        for c in rec.get("contexts") or []:
            pid = str(c.get("document_id") or hashlib.sha1(c["text"].encode()).hexdigest()[:12])
            passages.setdefault(pid, Passage(pid, c["text"].strip(), c.get("title", "") or ""))
            ids.append(pid)
        answers = tuple(t["text"] for t in rec.get("targets") or [] if t.get("text"))
        qtypes = rec.get("Question Type") or ["default"]
        examples.append(Example(
            id=str(_field(rec, "task_id", path, n)), question=turns[-1]["text"],
            answers=answers, gold_passage_ids=tuple(dict.fromkeys(ids)),
            category=qtypes[0], history=tuple({"role": t.get("speaker", "user"),
                                               "text": t["text"]} for t in turns[:-1]),
            metadata={"answerability": (rec.get("answerability") or [None])[0],
                      "collection": rec.get("Collection"), "turn": rec.get("turn")}))
    return Dataset("mtrag", Corpus(passages.values()), tuple(examples),
                   {str(path): sha256_file(path)})


# ---- plain JSONL ---------------------------------------------------------------------------
def load_jsonl_corpus(path: str | Path) -> Corpus:
    path = Path(path)
    return Corpus(Passage(str(o.get("id", o.get("_id"))) if ("id" in o or "_id" in o) else
                          _field(o, "id", path, n), _field(o, "text", path, n),
                          o.get("title", "") or "", dict(o.get("metadata") or {}))
                  for n, o in iter_jsonl(path))


def load_jsonl_examples(path: str | Path) -> list[Example]:
    out = []
    for n, o in iter_jsonl(path):
        _field(o, "id", Path(path), n)
        _field(o, "question", Path(path), n)
        try:
            out.append(Example.from_dict(o))
        except (TypeError, ValueError) as exc:
            raise DataError(str(path), f"bad example: {exc}", line=n) from None
    return out


def load_dataset(name_or_path: str) -> Dataset:
    """`synthetic`, `hotpotqa`, `scifact`, `mtrag`, or a path (BEIR dir, HotpotQA file,
    `{id,title,text}` JSONL corpus)."""
    from rag.corpus.synthetic import make_synthetic_world

    if name_or_path == "synthetic":
        w = make_synthetic_world()
        return Dataset(w.name, w.corpus, w.examples, {})
    named = {"hotpotqa": lambda r: load_hotpotqa(r / "hotpotqa" /
                                                 "hotpot_dev_distractor_1100.jsonl"),
             "scifact": lambda r: load_beir(r / "scifact", "test"),
             "mtrag": lambda r: load_mtrag(r / "mtrag" / "mtragun-human" / "generation_tasks" /
                                           "reference.jsonl")}
    if name_or_path in named:
        return named[name_or_path](data_root())
    p = Path(name_or_path)
    if p.is_dir():
        return load_beir(p)
    _exists(p)
    first = next(iter_jsonl(p), (None, {}))[1] if p.suffix == ".jsonl" else {}
    if p.suffix == ".json" or "supporting_facts" in first:
        return load_hotpotqa(p)
    corpus = load_jsonl_corpus(p)
    return Dataset(p.stem, corpus, (), {str(p): sha256_file(p)})
