"""Checking a JSON object read back from one of the project's own files (a key file's key, a
rollout's state) against the fields its record type has, so a hand-edited or foreign file is
refused in words ("missing field(s) salt") rather than by a dataclass signature."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def check_fields(record: Any, types: Mapping[str, type | tuple[type, ...]],
                 required: Sequence[str], where: str = "") -> dict[str, Any]:
    """`record` itself when it is an object with every `required` field, no field outside
    `types`, and each value of its field's type (a bool is not a number); else ValueError,
    its message prefixed by `where` (e.g. "key 2: ")."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}expected a JSON object")
    unknown = sorted(set(record) - set(types))
    missing = [name for name in required if name not in record]
    if unknown or missing:
        raise ValueError(where + "; ".join(
            ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
            + ([f"missing field(s) {', '.join(missing)}"] if missing else [])))
    for name, value in record.items():
        expected = types[name]
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ValueError(f"{where}field {name!r} has the wrong type")
    return record
