"""The prose's `ragpilot` commands are ones the CLI takes. Every `ragpilot ...` line in a fenced
block of README.md, docs/ and runbooks/ (continuation lines joined, `VAR=value` prefixes and shell
redirections cut) and every inline `ragpilot ...` span names sub-commands that exist and only
flags the sub-command declares; a line that is a runnable command (no `[optional]`, `a|b` or
`...` synopsis) must also parse as written. test_runbook_fanout_commands checks the cluster
runbook's commands more closely; this covers every page."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from serving.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
PROSE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "runbooks").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`(ragpilot [^`\n]+)`")
SHELL_OPS = ("|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&")


def _block_commands(block: str) -> list[list[str]]:
    out, pending = [], ""
    for line in block.splitlines():
        pending += line + "\n"
        if pending.rstrip().endswith("\\") or pending.count("'") % 2:
            continue
        words = shlex.split(pending.replace("\\\n", " "), comments=True)
        pending = ""
        while words and ("=" in words[0] and not words[0].startswith("-") or words[0] == "$"):
            words = words[1:]
        if words[:1] == ["ragpilot"]:
            out.append(words)
    return out


def commands(text: str) -> list[tuple[list[str], bool]]:
    """(words, runnable) for each `ragpilot` command in a page; inline spans are synopses."""
    found = [(w, True) for b in FENCE.findall(text) for w in _block_commands(b)]
    found += [(shlex.split(s), False) for s in INLINE.findall(FENCE.sub("", text))]
    out = []
    for words, runnable in found:
        cut = min([words.index(op) for op in SHELL_OPS if op in words] or [len(words)])
        words = words[:cut]
        synopsis = any(w[:1] in "[(" or w[-1:] in "])" or "..." in w or "*" in w
                       or ("|" in w and not w.startswith("-")) for w in words[1:])
        out.append((words, runnable and not synopsis))
    return out


def problems(words: list[str], runnable: bool, parser: argparse.ArgumentParser) -> list[str]:
    """What in one documented command the CLI does not take (empty when it all exists)."""
    p, rest = parser, words[1:]
    while rest:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or rest[0].startswith(("-", "[")) or "*" in rest[0]:
            break  # flags, or a pattern such as `ragpilot train-*`
        names = rest[0].split("|")
        unknown = [n for n in names if n not in subs[0].choices]
        if unknown:
            return [f"no sub-command {unknown[0]!r} under {p.prog!r}"]
        p, rest = subs[0].choices[names[0]], rest[1:]
    declared = {o for a in p._actions for o in a.option_strings}
    out = [f"{p.prog} has no flag {flag}"
           for w in rest if w.lstrip("[(").startswith("-")
           for flag in w.split("=")[0].strip("[]()").split("/")
           if flag and flag not in declared]
    if runnable and not out:
        try:
            parser.parse_args(words[1:])
        except SystemExit as e:
            if e.code:
                out.append("does not parse")
    return out


@pytest.mark.parametrize("page", PROSE, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_exists(page, capsys):
    parser = build_parser()
    found = commands(page.read_text())
    bad = {" ".join(w): why for w, runnable in found if (why := problems(w, runnable, parser))}
    capsys.readouterr()  # argparse's usage lines for a failed parse
    assert not bad, f"{page.name}: {bad}"


def test_the_prose_has_commands_of_both_kinds():
    found = [c for page in PROSE for c in commands(page.read_text())]
    assert sum(r for _, r in found) >= 40 and sum(not r for _, r in found) >= 20


@pytest.mark.parametrize("text, expected", [
    ("```bash\nragpilot tune --dataset x --no-such-flag 3\n```", "has no flag --no-such-flag"),
    ("```bash\nragpilot tune --budget\n```", "does not parse"),
    ("see `ragpilot rollout frobnicate`", "no sub-command 'frobnicate'"),
    ("```\nRAY_ADDRESS=auto ragpilot eval --dataset x \\\n  --bogus\n```", "has no flag --bogus"),
    ("`ragpilot keys list [--jsn]`", "has no flag --jsn"),
])
def test_the_check_catches_a_stale_command(text, expected, capsys):
    parser = build_parser()
    (words, runnable), = commands(text)
    assert any(expected in p for p in problems(words, runnable, parser))


def test_synopses_and_redirections_are_not_parsed_as_written():
    found = commands("```bash\nragpilot rollout status [--json]\n"
                     "ragpilot report --run runs/x > out.txt 2>&1\n```")
    assert [(w, r) for w, r in found] == [
        (["ragpilot", "rollout", "status", "[--json]"], False),
        (["ragpilot", "report", "--run", "runs/x"], True)]
    assert all(not problems(w, r, build_parser()) for w, r in found)
