"""One strict base for every settings model of ragpilot, and its YAML loader.

`StrictSettings` is a frozen pydantic model that refuses unknown keys. Its loaders turn every
validation error into a `ConfigError` that names

- the dotted path of the offending key (`policy.bounds.k.maxx`), prefixed by the model's
  `SECTION` (or the `where` the caller passes);
- for a key the model does not have, "unknown key" and the nearest known key ("did you mean
  `max`?"), even when a required sibling is missing too (an unknown key is usually a typo of
  the missing one, so it is the better message);
- the YAML file and the 1-based line of that key (of its nearest written parent when the key
  itself is missing), read from yaml's node marks.

    cfg = TunerSettings.from_yaml("configs/rl/tuner.yaml")
    cfg = TunerSettings.from_mapping({"bounds": {"k": {"min": 3, "max": 8}}})

A file may hold the mapping bare or under its section key (`policy: {...}`); subclasses with
other layouts override `_section_of`. Cross-field checks that need a ConfigError of their own
(not a pydantic error) go in `_after_load`.

`rag` never imports `rl` or `serving`; the settings of every package derive from this base.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from rag.errors import ConfigError

__all__ = ["StrictSettings", "UnknownKey", "YamlSource", "config_error"]

Loc = tuple[str, ...]


class UnknownKey(ValueError):
    """Raised inside a validator for a key that this reader of the model does not accept (the
    error names `<where>.<loc>.<key>: unknown key ...`)."""

    def __init__(self, key: str, hint: str = ""):
        self.key, self.hint = key, hint
        super().__init__(f"{key}: unknown key{hint}")


class YamlSource:
    """A YAML document read once: `data` (plain Python) and the line of every written key.

    `prefix` is the path of the mapping a model reads inside the document (e.g. ("policy",)
    when the file wraps it), so error locations relative to the model find their line."""

    def __init__(self, name: str, data: Any, lines: dict[Loc, int], prefix: Loc = ()):
        self.name, self.data, self.lines, self.prefix = name, data, lines, prefix

    @classmethod
    def read(cls, path: str | os.PathLike[str] | Traversable, field: str = "config"
             ) -> YamlSource:
        """Parse a file. ConfigError(`field`, ...) when it is missing or not valid YAML."""
        p = path if isinstance(path, Traversable) else Path(path)
        if not p.is_file():
            what = "is a directory, not a YAML file" if p.is_dir() else "does not exist"
            raise ConfigError(field, f"file {p} {what}")
        # decoded here, not by rag.textio (same rule, YAML drops a BOM itself): rag.config
        # imports this module, so its code is part of the row and retrieval caches' keys
        # (rl.kernel.evaluator.rows_version); a code change here re-keys every cached table
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(field, f"{p} is not UTF-8 (byte 0x{raw[exc.start]:02x})",
                              source=str(p), line=raw[:exc.start].count(b"\n") + 1) from None
        try:
            data = yaml.safe_load(text)
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(field, f"{p} is not valid YAML: {exc}") from None
        lines: dict[Loc, int] = {}
        if node is not None:
            dup = _collect_lines(node, (), lines)
            if dup is not None:  # YAML keeps the last silently: the first was meant, or not
                key, first, again = dup
                raise ConfigError(".".join(key), f"appears twice (lines {first} and {again}): "
                                                 "keep one", source=str(p), line=again)
        return cls(str(p), data, lines)

    def under(self, *keys: str) -> YamlSource:
        """The same document, with locations relative to the mapping at `keys`."""
        return YamlSource(self.name, self.data, self.lines, self.prefix + tuple(keys))

    def line_of(self, loc: tuple[Any, ...]) -> int | None:
        """Line of the key at `loc` (relative to `prefix`), else of its nearest written
        parent; None when not even the prefix was written."""
        path = self.prefix + tuple(str(x) for x in loc)
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return None


def _collect_lines(node: yaml.Node, path: Loc, out: dict[Loc, int]
                   ) -> tuple[Loc, int, int] | None:
    """Record the line of every key under `node`; returns the first mapping key written
    twice, as (path, first line, second line), else None."""
    dup = None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = path + (str(key.value),)
            if k in out and dup is None:  # paths are unique per mapping: k was this one's
                dup = (k, out[k], key.start_mark.line + 1)
            out.setdefault(k, key.start_mark.line + 1)
            dup = _collect_lines(value, k, out) if dup is None else dup
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            k = path + (str(i),)
            out.setdefault(k, item.start_mark.line + 1)
            found = _collect_lines(item, k, out)
            dup = dup or found
    return dup


# ---- errors ------------------------------------------------------------------------------------
def _field_keys(model: Any, loc: tuple[Any, ...]) -> list[str] | None:
    """The keys the model nested at `loc` accepts (aliases as written), None if unknown."""
    tp: Any = model
    for part in loc:
        tp = _model_in(tp)
        if tp is None:
            return None
        if isinstance(tp, tuple):  # dict[str, Model]: any key, then the value's model
            tp = tp[1]
            continue
        field = next((f for n, f in tp.model_fields.items()
                      if part in (n, f.alias, f.validation_alias)), None)
        if field is None:
            return None
        tp = field.annotation
    tp = _model_in(tp)
    if tp is None or isinstance(tp, tuple):
        return None
    return sorted(f.alias if isinstance(f.alias, str) else n for n, f in tp.model_fields.items())


def _model_in(tp: Any) -> Any:
    """A BaseModel subclass inside `tp` (Optional/Union), ("dict", Model) for a mapping of
    models, or None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = _model_in(arg)
            if found is not None:
                return found
    if origin is dict:
        inner = _model_in(typing.get_args(tp)[1])
        if isinstance(inner, type):
            return ("dict", inner)
    return None


def _unknown_hint(model: Any, loc: tuple[Any, ...]) -> str:
    known = _field_keys(model, loc[:-1]) if model is not None else None
    if not known:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean `{close[0]}`?"
    return f" (known: {', '.join(known)})"


def config_error(exc: ValidationError, where: str, source: YamlSource | None = None,
                 model: Any = None) -> ConfigError:
    """The ConfigError of a pydantic error: an unknown key first (a typo explains a missing
    sibling), else the first error. `where` prefixes the dotted path; `source` adds the file
    and line; `model` (the class validated) lets an unknown key suggest the key meant."""
    errors = exc.errors()
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    err = (extra or errors)[0]
    loc = tuple(err.get("loc", ()))
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, ConfigError):  # a nested loader already named the key in full
        return _located(ctx_err.field, ctx_err.message, source, None)
    if isinstance(ctx_err, UnknownKey):
        loc = loc + (ctx_err.key,)
        return _located(_dotted(where, loc), f"unknown key{ctx_err.hint}", source, loc)
    field = _dotted(where, loc)
    if err.get("type") == "extra_forbidden":
        return _located(field, "unknown key" + _unknown_hint(model, loc), source, loc)
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if msg.startswith("Field required"):
        msg = "required key is missing"
    head = msg.split(" ", 1)[0]
    if not loc and head.isidentifier():  # model-level validator: name the field it mentions
        loc = (head,)
        field = _dotted(where, loc)
    return _located(field, msg, source, loc)


def _dotted(where: str, loc: tuple[Any, ...]) -> str:
    return ".".join([where, *(str(x) for x in loc)]) if where else ".".join(map(str, loc))


def _located(field: str, message: str, source: YamlSource | None,
             loc: tuple[Any, ...] | None) -> ConfigError:
    if source is None:
        return ConfigError(field, message)
    return ConfigError(field, message, source=source.name,
                       line=source.line_of(loc) if loc is not None else None)


def _numeric(annotation: Any) -> bool:
    """int or float, optionally in a union with None (not bool, not other unions)."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        rest = [a for a in args if a is not type(None)]
        return len(rest) == 1 and rest[0] in (int, float)
    return False


# ---- the base ----------------------------------------------------------------------------------
class StrictSettings(BaseModel):
    """Frozen, unknown keys refused; `from_mapping` / `from_yaml` raise ConfigError naming the
    key (and the file and line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    SECTION: ClassVar[str] = ""
    """The name errors start with, and the key a file may wrap the mapping in."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads `k: true` (or `--set k=yes`) as k = 1: a number field takes numbers
        if isinstance(v, bool) and info.field_name is not None and _numeric(
                cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got {str(v).lower()}")
        return v

    @classmethod
    def from_mapping(cls, data: Any, where: str | None = None,
                     source: YamlSource | None = None) -> Self:
        """Validate a mapping. `where` (default `SECTION`) prefixes every error's dotted path;
        `source` locates it in a YAML file."""
        where = cls.SECTION if where is None else where
        if not isinstance(data, Mapping):
            raise _located(where or "config", f"must be a mapping, got {type(data).__name__}",
                           source, ())
        try:
            obj = cls.model_validate(dict(data))
        except ValidationError as exc:
            raise config_error(exc, where, source, cls) from None
        return obj._after_load(where, source)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str] | Traversable) -> Self:
        """Read a YAML file holding the mapping bare or under `SECTION:`."""
        src = YamlSource.read(path, cls.SECTION or "config")
        data, keys = cls._section_of({} if src.data is None else src.data, src.name)
        return cls.from_mapping(data, source=src.under(*keys))

    @classmethod
    def _section_of(cls, data: Any, name: str) -> tuple[Any, tuple[str, ...]]:
        """(the mapping this model reads, the keys leading to it) in a parsed file."""
        if cls.SECTION and isinstance(data, dict) and set(data) == {cls.SECTION}:
            return data[cls.SECTION], (cls.SECTION,)
        return data, ()

    def _after_load(self, where: str, source: YamlSource | None) -> Self:
        """Checks after validation that raise their own ConfigError (default: none); `source`
        (None for a mapping) is where `from_mapping` found the data."""
        return self
