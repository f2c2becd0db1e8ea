"""What every `ragpilot` command shares: the one `--set KEY=VALUE` parser, config loaders, and
the translation of library field names into the flags a user typed.

Contract of a command function: `cmd_x(args) -> int` (the exit code); bad input raises a
`rag.errors.RagError`, which `serving.cli.main` prints as `error: <field>: <message>` and turns
into exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ConfigError

EXIT_BAD_INPUT = 2


def add_set_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The `--set KEY=VALUE` option (repeatable; parsed by `parse_sets`)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=help or "override a config key (dotted for nested keys); the "
                                     "value is read as YAML, e.g. --set k=5")


def output_file(value: str | Path, flag: str, what: str) -> Path:
    """`value` as a file a command will write, checked before its work starts (found after
    it, the result had nowhere to go): a directory there, or a file where one of its parent
    directories must be, is a ConfigError naming `flag`."""
    path = Path(value)
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a directory; name the {what} file to write")
    above = next(p for p in path.parents if p.exists())  # ends at "." or the root
    if not above.is_dir():
        raise ConfigError(flag, f"cannot create {path.parent}: {above} is not a directory")
    return path


def port_number(value: str) -> int:
    """argparse type of a TCP port flag: 1-65535 (argparse then exits 2 naming the flag)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """`["k=5", "variant=bm25"]` -> `{"k": 5, "variant": "bm25"}`: the key is stripped, the
    value parsed as YAML (so `5` is an int, `on` a bool, `[1, 2]` a list). An item without
    `=` raises ConfigError naming `--set`. Later items win over earlier ones."""
    changes: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            changes[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError("--set", f"{item!r}: the value is not valid YAML ({problem})"
                              ) from None
    return changes


def with_sets(config: Any, items: list[str] | None) -> Any:
    """`config.replace(**parse_sets(items))` (the config itself when there is nothing to set):
    every config class the CLI loads (RAGConfig, RerankerTrainConfig, GeneratorSFTConfig,
    SelectionConfig) validates its overrides in `replace`."""
    changes = parse_sets(items)
    return config.replace(**changes) if changes else config


def rag_config(path: str | None, overrides: list[str] | None):
    """The RAG config of `--config PATH` (default RAGConfig()) with `--set` overrides."""
    from rag.config import RAGConfig

    return with_sets(RAGConfig.from_yaml(path) if path else RAGConfig(), overrides)


def add_settings_argument(parser, help: str = "tuner settings YAML (reward, gates, datasets, "
                                              "base config; default configs/rl/tuner.yaml)") -> None:
    """`--settings PATH`: the tuner settings file. `--policy` is its old name, accepted for one
    release with a one-line deprecation notice (`tuner_settings`)."""
    parser.add_argument("--settings", help=help)
    parser.add_argument("--policy", dest="legacy_settings", help=argparse.SUPPRESS)


def tuner_settings(args_or_path):
    """The tuner settings of `--settings PATH` (default configs/rl/tuner.yaml). Takes the parsed
    arguments (reads `settings`, and the deprecated `--policy` with a notice on stderr) or a
    path (None: the defaults)."""
    from rl.kernel.settings import TunerSettings

    path = args_or_path
    if isinstance(args_or_path, argparse.Namespace):
        path = args_or_path.settings
        legacy = getattr(args_or_path, "legacy_settings", None)
        if legacy:
            if path:
                raise ConfigError("--policy", "give the settings file once: --settings "
                                              "(--policy is its deprecated name)")
            print("deprecated: --policy names the tuner settings file; use --settings "
                  "(--policy will be removed in the next release)", file=sys.stderr)
            path = legacy
    return TunerSettings.from_yaml(path) if path else TunerSettings.defaults()


@contextmanager
def flags(names: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a ConfigError whose field is a library name in `names` (e.g. `budget`) under
    the flag the user typed (`--budget`), so the message points at the command line."""
    try:
        yield
    except ConfigError as exc:
        if exc.field in names:
            raise ConfigError(names[exc.field], exc.message) from None
        raise
