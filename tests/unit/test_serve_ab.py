"""bench/serve_ab.py's arguments and checkout: a ref that is not a commit is a
usage error (exit 2) naming the argument, and a good ref gives a detached worktree whose
configs import as `ragpilot_configs` (the shim the ref's serve_load.py runs with). No Serve
here: the A/B itself is a benchmark."""

from __future__ import annotations

import subprocess

import pytest
from bench import serve_ab


def test_a_ref_that_is_not_a_commit_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_ab.parser().parse_args(["--ref", "no-such-ref-xyz"])
    assert exit_.value.code == 2
    assert "argument --ref: no-such-ref-xyz: not a commit" in capsys.readouterr().err


def test_checkout_gives_a_detached_worktree_with_the_configs_shim(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=serve_ab.REPO,
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout (e.g. an unpacked wheel)")
    where = tmp_path / "ref"
    sha = serve_ab.commit_of("HEAD")
    serve_ab.checkout(sha, where)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                              text=True, check=True).stdout.strip()
        assert head == sha and len(sha) == 40
        shim = where / ".abshim" / "ragpilot_configs"
        assert shim.resolve() == (where / "configs").resolve()
        assert (shim / "rag").is_dir()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)],
                       cwd=serve_ab.REPO, capture_output=True)


def test_haproxy_against_a_ref_without_the_choice_is_a_usage_error(monkeypatch, capsys):
    """Both sides serve behind the same proxy; a ref older than the proxy choice always used
    Serve's, so `--proxy haproxy` against it would compare topologies, not code."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=serve_ab.REPO,
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout (e.g. an unpacked wheel)")
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=serve_ab.REPO,
                           capture_output=True, text=True).stdout.split()[0]
    assert serve_ab.has_proxy_choice(serve_ab.commit_of("HEAD"))
    if serve_ab.has_proxy_choice(first):
        pytest.skip("shallow clone: its oldest commit already has the proxy choice")
    monkeypatch.setattr("sys.argv", ["serve_ab.py", "--ref", first, "--proxy", "haproxy"])
    with pytest.raises(SystemExit) as exit_:
        serve_ab.main()
    assert exit_.value.code == 2
    assert "argument --proxy" in capsys.readouterr().err
