"""An ordered, id-addressable collection of passages, persisted as JSONL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from rag.errors import DataError
from rag.types import Passage


class Corpus:
    """Passages in a fixed order; `index_of(id)` gives the row used by array-based indexes."""

    def __init__(self, passages: Iterable[Passage]):
        self._passages: list[Passage] = list(passages)
        self._row: dict[str, int] = {}
        for i, p in enumerate(self._passages):
            if p.id in self._row:
                raise DataError("corpus", f"duplicate passage id {p.id!r}")
            self._row[p.id] = i

    def __len__(self) -> int:
        return len(self._passages)

    def __iter__(self) -> Iterator[Passage]:
        return iter(self._passages)

    def __getitem__(self, pid: str) -> Passage:
        return self._passages[self._row[pid]]

    def __contains__(self, pid: object) -> bool:
        return pid in self._row

    def at(self, row: int) -> Passage:
        return self._passages[row]

    def index_of(self, pid: str) -> int:
        return self._row[pid]

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self._passages]

    def fingerprint(self) -> str:
        """16 hex chars of sha256 over (id, title, text) in order: the cache key of artefacts
        computed from this corpus (embeddings, postings, graphs)."""
        if not hasattr(self, "_fp"):
            h = hashlib.sha256()
            for p in self._passages:
                h.update(f"{p.id}\x1f{p.title}\x1f{p.text}\x1e".encode())
            self._fp = h.hexdigest()[:16]
        return self._fp

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w") as f:
            for p in self._passages:
                f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        """Read `{"id", "title", "text", "metadata"}` JSONL; a bad line raises DataError(line)."""
        path = Path(path)
        if not path.exists():
            raise DataError(str(path), "file does not exist")
        passages = []
        with path.open() as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    passages.append(Passage.from_dict(d))
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DataError(str(path), f"malformed passage: {exc}", line=n) from None
        return cls(passages)
