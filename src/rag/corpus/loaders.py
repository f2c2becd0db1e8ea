"""Dataset loaders: BEIR, HotpotQA (Hugging Face JSONL or the official JSON list), MTRAG
generation tasks, plain JSONL, and the generated synthetic world.

Each returns a `Dataset` (corpus + examples + the source files with sha256). Parse errors name
the file, the 1-based line (or the record's index in a JSON list) and the field (DataError); a
missing file is a DataError too.

Names: `load_dataset("hotpotqa")` (a built-in name) gives a dataset called "hotpotqa" with
`builtin=True`; a dataset given by path is called after its file or folder (never a built-in
name: "hotpotqa.jsonl" becomes "hotpotqa-local"), so the committed split manifests are only
applied to it when its content hashes match (`rag.corpus.hygiene.manifest_for`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rag.corpus.store import Corpus
from rag.errors import DataError
from rag.textio import BOM, NotUtf8, decode_text, iter_lines
from rag.types import Example, Passage

BUILTIN_DATASETS = ("synthetic", "synthetic-choices", "hotpotqa", "scifact", "mtrag")
"""Names `load_dataset` resolves under the data root instead of as a path."""


@dataclass(frozen=True)
class Dataset:
    """`sources`: path -> sha256 of every file read; `builtin`: loaded by a built-in name."""

    name: str
    corpus: Corpus
    examples: tuple[Example, ...]
    sources: dict[str, str] = field(default_factory=dict)
    builtin: bool = False

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


def path_name(path: str | Path) -> str:
    """The name of a dataset given by path: the file's stem or the folder's name, suffixed
    "-local" when it would be a built-in name."""
    p = Path(path)
    stem = (p.name if p.is_dir() else p.stem) or "dataset"
    return f"{stem}-local" if stem in BUILTIN_DATASETS else stem


def _exists(path: Path) -> Path:
    if not path.exists():
        raise DataError(str(path), "file does not exist")
    return path


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 text file (`rag.textio.iter_lines`: a leading BOM
    dropped); bytes that are not UTF-8 raise DataError naming the line and column."""
    try:
        yield from iter_lines(path)
    except NotUtf8 as exc:
        raise DataError(str(path), str(exc), line=exc.line) from None


def _read_text(path: Path) -> str:
    """The whole file as UTF-8 (a leading BOM dropped); a byte that is not names its line and
    column (DataError)."""
    try:
        return decode_text(path.read_bytes())
    except NotUtf8 as exc:
        raise DataError(str(path), str(exc), line=exc.line) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-empty line; a bad line raises DataError(line)."""
    path = _exists(Path(path))
    if path.is_dir():
        raise DataError(str(path), "is a directory, not a JSONL file")
    for n, line in _lines(path):
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


def _id(obj: dict, key: str, path: Path, line: int | None, at: str = "") -> str:
    """An id field: a non-empty string or an integer (null, a list or a bool is refused, not
    turned into the string "None")."""
    v = _field(obj, key, path, line)
    if isinstance(v, bool) or not isinstance(v, (str, int)) or str(v).strip() == "":
        raise DataError(str(path), f"{at}field {key!r}: expected a non-empty string or an "
                                   f"integer id, got {v!r}", line=line)
    return str(v)


def _str(obj: dict, key: str, path: Path, line: int | None, at: str = "", *,
         required: bool = True, non_empty: bool = False) -> str:
    """A text field as a string: missing (when `required`), null, a number or a list is a
    DataError naming the field; an optional one absent or null is ""."""
    if key not in obj and not required:
        return ""
    v = _field(obj, key, path, line)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (non_empty and not v.strip()):
        want = "a non-empty string" if non_empty else "a string"
        raise DataError(str(path), f"{at}field {key!r}: expected {want}, got {v!r}", line=line)
    return v


def _unique(seen: dict[str, str], key: str, what: str, path: Path, line: int | None,
            at: str = "") -> None:
    """DataError on the second occurrence of `key` (a later record would silently replace
    or shadow the first), naming where the first was: its line, else `at` (a JSON list's
    "record N: ")."""
    here = f"line {line}" if line else at.rstrip(": ") or "an earlier record"
    if key in seen:
        raise DataError(str(path), f"{at}duplicate {what} {key!r} (first at {seen[key]})",
                        line=line)
    seen[key] = here


# ---- BEIR ---------------------------------------------------------------------------------
def load_beir(directory: str | Path, split: str = "test", name: str | None = None) -> Dataset:
    """A BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv); examples are the judged
    queries. `name` defaults to `path_name(directory)`."""
    d = Path(directory)
    corpus_path, q_path = d / "corpus.jsonl", d / "queries.jsonl"
    qrels_path = d / "qrels" / f"{split}.tsv"
    passages, pids = [], {}
    for n, o in iter_jsonl(corpus_path):
        pid = _id(o, "_id", corpus_path, n)
        _unique(pids, pid, "passage id", corpus_path, n)
        passages.append(Passage(pid, _str(o, "text", corpus_path, n),
                                _str(o, "title", corpus_path, n, required=False)))
    if not passages:
        raise DataError(str(corpus_path), "no passages")
    queries: dict[str, str] = {}
    qlines: dict[str, str] = {}
    for n, o in iter_jsonl(q_path):
        qid = _id(o, "_id", q_path, n)
        _unique(qlines, qid, "query id", q_path, n)
        queries[qid] = _str(o, "text", q_path, n, non_empty=True)
    qrels: dict[str, dict[str, int]] = {}
    qrel_lines: dict[str, str] = {}
    first_line: dict[str, int] = {}  # query id -> the first qrels line naming it
    for n, line in _lines(_exists(qrels_path)):
        if not line.strip():
            continue  # a blank line (spaces only too, as in the JSONL files)
        row = next(csv.reader([line], delimiter="\t"), [])
        if n == 1 and not row[-1].strip().lstrip("-").isdigit():
            continue  # header
        if len(row) < 3:
            raise DataError(str(qrels_path), "expected query-id, corpus-id, score", line=n)
        try:
            grade = int(row[2])
        except ValueError:
            raise DataError(str(qrels_path), f"score {row[2]!r} is not an integer",
                            line=n) from None
        _unique(qrel_lines, f"{row[0]}\t{row[1]}", "judgement (query-id, corpus-id)",
                qrels_path, n)
        qrels.setdefault(row[0], {})[row[1]] = grade
        first_line.setdefault(row[0], n)
    examples = []
    for qid, rel in qrels.items():
        if qid not in queries:
            raise DataError(str(qrels_path), f"query {qid!r} is not in queries.jsonl",
                            line=first_line[qid])
        examples.append(Example(id=qid, question=queries[qid], qrels=rel,
                                gold_passage_ids=tuple(p for p, g in rel.items() if g > 0),
                                category=split))
    return Dataset(name or path_name(d), Corpus(passages), tuple(examples),
                   {str(p): sha256_file(p) for p in (corpus_path, q_path, qrels_path)})


# ---- HotpotQA -----------------------------------------------------------------------------
def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "p"


def _hotpot_records(path: Path) -> Iterator[tuple[int | None, str, dict]]:
    """(line or None, where-prefix for messages, record) of a JSONL file or a JSON list."""
    if _exists(path).is_dir():
        raise DataError(str(path), "is a directory, not a HotpotQA file")
    with path.open(encoding="utf-8", errors="replace") as f:
        head = f.read(64).removeprefix(BOM).lstrip()
    if head.startswith("["):
        try:
            data = json.loads(_read_text(path))
        except json.JSONDecodeError as exc:
            raise DataError(str(path), f"malformed JSON: {exc.msg}", line=exc.lineno) from None
        for i, rec in enumerate(data, 1):  # 1-based, as lines are
            if not isinstance(rec, dict):
                raise DataError(str(path), f"record {i}: expected a JSON object")
            yield None, f"record {i}: ", rec
    else:
        for n, rec in iter_jsonl(path):
            yield n, "", rec


def _hotpot_pairs(rec: dict, path: Path, n: int | None, at: str
                  ) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int]]]:
    """(title, sentences) paragraphs and (title, sent_id) facts of one record, either layout;
    a malformed one raises DataError naming the field."""
    def bad(fld: str, msg: str) -> DataError:
        return DataError(str(path), f"{at}field {fld!r}: {msg}", line=n)

    ctx, sf = _field(rec, "context", path, n), _field(rec, "supporting_facts", path, n)
    if isinstance(ctx, dict):  # Hugging Face layout: parallel lists
        for key in ("title", "sentences"):
            if not isinstance(ctx.get(key), list):
                raise bad(f"context.{key}", "missing or not a list")
        if len(ctx["title"]) != len(ctx["sentences"]):
            raise bad("context.sentences", f"{len(ctx['sentences'])} entries for "
                                           f"{len(ctx['title'])} titles")
        pairs = list(zip(ctx["title"], ctx["sentences"], strict=True))
        if not isinstance(sf, dict) or not all(isinstance(sf.get(k), list)
                                               for k in ("title", "sent_id")):
            raise bad("supporting_facts", "expected {title: [...], sent_id: [...]}")
        if len(sf["title"]) != len(sf["sent_id"]):
            raise bad("supporting_facts.sent_id", f"{len(sf['sent_id'])} entries for "
                                                  f"{len(sf['title'])} titles")
        raw_facts = list(zip(sf["title"], sf["sent_id"], strict=True))
    else:  # official layout: [[title, [sentences]], ...] and [[title, sent_id], ...]
        if not isinstance(ctx, list) or not all(isinstance(c, list) and len(c) == 2
                                                for c in ctx):
            raise bad("context", "expected a list of [title, sentences] pairs")
        if not isinstance(sf, list) or not all(isinstance(x, list) and len(x) == 2
                                               for x in sf):
            raise bad("supporting_facts", "expected a list of [title, sent_id] pairs")
        pairs = [(t, s) for t, s in ctx]
        raw_facts = [(t, i) for t, i in sf]
    for t, sents in pairs:
        if not isinstance(t, str) or not isinstance(sents, list) or not all(
                isinstance(x, str) for x in sents):
            raise bad("context", f"paragraph {t!r}: expected a title and a list of sentences")
    facts = []
    for t, i in raw_facts:
        try:
            facts.append((str(t), int(i)))
        except (TypeError, ValueError):
            raise bad("supporting_facts.sent_id", f"{i!r} is not an integer") from None
    return pairs, facts


def load_hotpotqa(path: str | Path, pooled: bool = True, name: str | None = None) -> Dataset:
    """Paragraphs become passages (title, sentences joined; metadata keeps the sentences).
    pooled=True: one deduplicated corpus over all examples (ids: title slug + text hash).
    A supporting-fact title absent from the record's context yields no gold passage (counted
    by `rag.corpus.hygiene.gold_report`). `name` defaults to `path_name(path)`."""
    path = Path(path)
    passages: dict[str, Passage] = {}
    examples = []
    qids: dict[str, str] = {}
    for n, at, rec in _hotpot_records(path):
        qid = _id(rec, "id" if "id" in rec else "_id", path, n, at) \
            if ("id" in rec or "_id" in rec) else ""
        if not qid:
            raise DataError(str(path), f"{at}missing field 'id'", line=n)
        _unique(qids, qid, "question id", path, n, at)
        pairs, facts = _hotpot_pairs(rec, path, n, at)
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
        answer = _field(rec, "answer", path, n)
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise DataError(str(path), f"{at}field 'answer': expected a string, got "
                                       f"{answer!r}", line=n)
        qtype = rec.get("type")
        if qtype is not None and not isinstance(qtype, str):
            raise DataError(str(path), f"{at}field 'type': expected a string, got {qtype!r}",
                            line=n)
        examples.append(Example(
            id=qid, question=_str(rec, "question", path, n, at, non_empty=True),
            answers=(str(answer),),
            supporting_facts=tuple(facts), gold_titles=gold_titles,
            gold_passage_ids=tuple(title_to_id[t] for t in gold_titles if t in title_to_id),
            category=qtype or "default", metadata={"level": rec.get("level")}))
    if not examples:
        raise DataError(str(path), "no records")
    return Dataset(name or path_name(path), Corpus(passages.values()), tuple(examples),
                   {str(path): sha256_file(path)})


# ---- MTRAG ---------------------------------------------------------------------------------
def load_mtrag(path: str | Path, name: str | None = None) -> Dataset:
    """MTRAG generation tasks: gold passages inline; history = previous turns. `name` defaults
    to `path_name(path)`."""
    path = Path(path)
    passages: dict[str, Passage] = {}
    examples = []
    for n, rec in iter_jsonl(path):
        turns = _field(rec, "input", path, n)
        if not isinstance(turns, list) or not turns:
            raise DataError(str(path), "field 'input': expected a non-empty list of turns",
                            line=n)
        if not all(isinstance(t, dict) and isinstance(t.get("text"), str) for t in turns):
            raise DataError(str(path), "field 'input': every turn needs a 'text'", line=n)
        contexts = rec.get("contexts") or []
        if not isinstance(contexts, list) or not all(
                isinstance(c, dict) and isinstance(c.get("text"), str) for c in contexts):
            raise DataError(str(path), "field 'contexts': every context needs a 'text'",
                            line=n)
        targets = rec.get("targets") or []
        if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
            raise DataError(str(path), "field 'targets': expected a list of objects", line=n)
        ids = []
        for c in contexts:
            pid = str(c.get("document_id") or hashlib.sha1(c["text"].encode()).hexdigest()[:12])
            passages.setdefault(pid, Passage(pid, c["text"].strip(), c.get("title", "") or ""))
            ids.append(pid)
        answers = tuple(t["text"] for t in targets if t.get("text"))
        qtypes = rec.get("Question Type") or ["default"]
        examples.append(Example(
            id=str(_field(rec, "task_id", path, n)), question=turns[-1]["text"],
            answers=answers, gold_passage_ids=tuple(dict.fromkeys(ids)),
            category=str(qtypes[0]), history=tuple({"role": t.get("speaker", "user"),
                                                    "text": t["text"]} for t in turns[:-1]),
            metadata={"answerability": (rec.get("answerability") or [None])[0],
                      "collection": rec.get("Collection"), "turn": rec.get("turn")}))
    return Dataset(name or path_name(path), Corpus(passages.values()), tuple(examples),
                   {str(path): sha256_file(path)})


# ---- plain JSONL ---------------------------------------------------------------------------
def load_jsonl_corpus(path: str | Path) -> Corpus:
    """An `{id (or _id), text, title?, metadata?}` JSONL corpus; every field is checked
    (DataError naming the file, line and field), ids must be unique, and it must hold at
    least one passage."""
    path = Path(path)
    out, seen = [], {}
    for n, o in iter_jsonl(path):
        pid = _id(o, "id" if "id" in o or "_id" not in o else "_id", path, n)
        _unique(seen, pid, "passage id", path, n)
        meta = o.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise DataError(str(path), f"field 'metadata': expected an object, got {meta!r}",
                            line=n)
        out.append(Passage(pid, _str(o, "text", path, n), _str(o, "title", path, n,
                                                             required=False), dict(meta or {})))
    if not out:
        raise DataError(str(path), "no passages")
    return Corpus(out)


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


HOTPOTQA_FILE = "hotpotqa/hotpot_dev_distractor_1100.jsonl"
MTRAG_FILE = "mtrag/mtragun-human/generation_tasks/reference.jsonl"
"""The built-in datasets' files, relative to `data_root()` (SciFact is the folder `scifact`)."""


def load_dataset(name_or_path: str) -> Dataset:
    """A built-in name (`BUILTIN_DATASETS`: synthetic, synthetic-choices, hotpotqa, scifact,
    mtrag, found under `data_root()`) or a path: a BEIR folder, a HotpotQA file (.json list, or JSONL whose first
    record has `supporting_facts`), else an `{id,title,text}` JSONL corpus (no examples).
    Path-loaded datasets are named by `path_name` and have `builtin=False`."""
    from rag.corpus.synthetic import make_synthetic_world

    if name_or_path == "synthetic":
        w = make_synthetic_world()
        return Dataset(w.name, w.corpus, w.examples, {}, builtin=True)
    if name_or_path == "synthetic-choices":  # rag.corpus.synthetic_choices
        from rag.corpus.synthetic_choices import make_choice_world

        w = make_choice_world()
        return Dataset(w.name, w.corpus, w.examples, {}, builtin=True)
    named = {"hotpotqa": lambda r: load_hotpotqa(r / HOTPOTQA_FILE),
             "scifact": lambda r: load_beir(r / "scifact", "test"),
             "mtrag": lambda r: load_mtrag(r / MTRAG_FILE)}
    if name_or_path in named:
        return replace(named[name_or_path](data_root()), name=name_or_path, builtin=True)
    p = Path(name_or_path)
    if p.is_dir():
        return load_beir(p)
    _exists(p)
    first = next(iter_jsonl(p), (None, {}))[1] if p.suffix == ".jsonl" else {}
    if p.suffix == ".json" or "supporting_facts" in first:
        return load_hotpotqa(p)
    corpus = load_jsonl_corpus(p)
    return Dataset(path_name(p), corpus, (), {str(p): sha256_file(p)})
