"""runbooks/ray_cluster.md's `ragpilot` commands (issue 23: eval/index fan-out, tune cluster
flags, training as Ray jobs) are ones the CLI takes, and the training jobs it shows for a
cluster ask for a GPU. The `ray job submit` lines are checked by test_kuberay_manifests."""

from __future__ import annotations

from tests.unit.test_kuberay_manifests import _commands


def _ragpilot_commands() -> list[list[str]]:
    out = []
    for words in _commands():
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # VAR=value prefixes
        if words and words[0] == "ragpilot":
            out.append(words)
    return out


def test_every_ragpilot_command_parses():
    from serving.cli import build_parser

    cmds = _ragpilot_commands()
    parser = build_parser()
    for words in cmds:
        parser.parse_args(words[1:])  # SystemExit on an argument the CLI does not take
    used = {w for c in cmds for w in c}
    assert {"--workers", "--ray-address", "--max-concurrent", "--cpus-per-trial",
            "--reuse-actors", "--submit", "--gpus", "--wait"} <= used


def test_cluster_training_jobs_ask_for_a_gpu():
    subs = [c for c in _ragpilot_commands() if "--submit" in c]
    assert subs
    for c in subs:
        if "127.0.0.1" not in " ".join(c):  # the local test head has no GPU
            assert "--gpus" in c, c
