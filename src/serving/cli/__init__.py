"""`ragpilot` command line: thin argparse modules over the library, one per command group.

    data       index | query | eval | data-report | prompts | models    (rag)
    demo       demo                                                     (serving.demo)
    serve      serve | export-interactions                              (serving.launch, .store)
    tune       tune | report | tuner-eval                               (rl.tuner.run, .report)
    router     router train (old name: policy train)                    (rl.routing.train)
    rollout    rollout status | start | replay | advance | rollback      (rl.promotion.service)
    keys       keys create | list | revoke                              (serving.auth)
    train      train-reranker | train-generator sft|dpo|ipo|orpo       (rl.adaptation)
    selection  select run | ablate                                      (rl.selection)

Every `--set KEY=VALUE` goes through `serving.cli.common.parse_sets`. `ragpilot --version`
prints the installed package's version. Bad input (unknown config key, value out of bounds,
missing file, malformed line, empty question) prints `error: <field or file:line>: <message>`
and exits with code 2; so does an argument argparse refuses (unknown choice, missing value).
Long work (index builds, embedding, evaluation, tuning, training) reports its stages, counts and
an estimate of the rest on stderr (`rag.progress`: a live bar on a terminal, lines in a log).
The Serve app never imports this package.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

from rag import progress
from rag.errors import RagError
from serving.cli.common import EXIT_BAD_INPUT

__all__ = ["build_parser", "main", "version"]


def version() -> str:
    """The installed `ragpilot` distribution's version ("unknown" when run from a source tree
    that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ragpilot")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from serving.cli import data, demo, keys, rollout, router, selection, serve, train, tune

    p = argparse.ArgumentParser(prog="ragpilot",
                                description="ragpilot: auto-tuning control plane for RAG")
    p.add_argument("--version", action="version", version=f"ragpilot {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (data, demo, serve, tune, router, rollout, keys, train, selection):
        group.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (0 ok, 1 a refused rollout step, 2 bad input)
    instead of raising SystemExit, so tests and `sys.exit(main())` read it alike."""
    from rag.env import configure_runtime_env

    configure_runtime_env()  # the CLI is an entry point: thread and offline defaults first
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a refused argument (2)
        return (0 if exc.code is None else exc.code if isinstance(exc.code, int)
                else EXIT_BAD_INPUT)
    try:
        # long work says what it does on stderr (rag.progress), unless the command shows its
        # own stages (the demo's live display)
        with (nullcontext() if getattr(args, "shows_own_progress", False)
              else progress.reporting()):
            return int(args.func(args) or 0)
    except RagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as exc:
        # a path argument of the wrong kind (a folder where a file goes, a file where --out
        # makes a folder): the path and what is wrong with it, not a traceback
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
