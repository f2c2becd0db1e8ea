"""Reading text files the one way the project does: UTF-8, a leading byte-order mark dropped
(editors on Windows write one; JSON and TSV parsers would otherwise choke on it, or read it as
part of the first field), and a byte that is not UTF-8 located by line and column.

Callers turn `NotUtf8` into their own typed error (a loader's DataError, an evidence file's
ConfigError) naming the file. `rag.settings_base` keeps its own copy of the rule: its code is
part of the row caches' key (`rl.kernel.evaluator.rows_version`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BOM = "\ufeff"


class NotUtf8(ValueError):
    """A byte that is not UTF-8, at a 1-based line and column."""

    def __init__(self, byte: int, line: int, column: int):
        self.byte, self.line, self.column = byte, line, column
        super().__init__(f"not UTF-8: byte 0x{byte:02x} at column {column}")


def decode_text(raw: bytes) -> str:
    """A whole file's bytes as text (NotUtf8 naming the line and column)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        raise NotUtf8(raw[exc.start], raw.count(b"\n", 0, exc.start) + 1,
                      exc.start - line_start + 1) from None
    return text.removeprefix(BOM)


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text with its line ending) of a file, decoded line by line, so a
    bad byte is found without reading the whole file first."""
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise NotUtf8(raw[exc.start], n, exc.start + 1) from None
            yield n, text.removeprefix(BOM) if n == 1 else text
