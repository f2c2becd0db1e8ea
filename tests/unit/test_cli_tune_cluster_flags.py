"""`ragpilot tune`'s cluster flags: --max-concurrent, --cpus-per-trial, --reuse-actors and
--ray-address reach `rl.tuner.tune_search.tune_search` unchanged as its `TuneOptions` (any of
them runs the search on Ray Tune; none, in this process); a bad value
exits 2 naming the flag before any data or Ray work, as does an `--out` that cannot be a
directory. No Ray runtime is started here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rl.tuner.tune_search import TuneOptions
from serving.cli import main


class _Called(Exception):
    def __init__(self, kwargs):
        super().__init__("called")
        self.kwargs = kwargs


@pytest.fixture
def captured(monkeypatch):
    """Replace run_tuning: the test reads the keywords the CLI passed."""
    import rl.tuner.run as run

    def fake(*args, **kwargs):
        raise _Called(kwargs)

    monkeypatch.setattr(run, "run_tuning", fake)
    return fake


def _tune(*extra: str, method: str = "tpe"):
    return ["tune", "--dataset", "synthetic", "--method", method, "--no-mlflow", *extra]


def test_flags_reach_tune_search_keywords(captured):
    with pytest.raises(_Called) as got:
        main(_tune("--max-concurrent", "2", "--cpus-per-trial", "0.5", "--reuse-actors", "no",
                   "--ray-address", "127.0.0.1:6390"))
    assert got.value.kwargs["tune"] == TuneOptions(
        max_concurrent=2, resources_per_trial={"cpu": 0.5}, reuse_actors=False,
        ray_address="127.0.0.1:6390")


def test_no_flags_pass_nothing(captured):
    with pytest.raises(_Called) as got:
        main(_tune())
    assert got.value.kwargs["tune"] is None


@pytest.mark.parametrize(("extra", "flag"), [
    (["--max-concurrent", "0"], "--max-concurrent"),
    (["--max-concurrent", "two"], "--max-concurrent"),
    (["--cpus-per-trial", "0"], "--cpus-per-trial"),
    (["--cpus-per-trial", "-1"], "--cpus-per-trial"),
    (["--cpus-per-trial", "nan"], "--cpus-per-trial"),
    (["--cpus-per-trial", "lots"], "--cpus-per-trial"),
    (["--reuse-actors", "maybe"], "--reuse-actors"),
    (["--ray-address", "not an address"], "--ray-address"),
    (["--ray-address", "127.0.0.1:99999"], "--ray-address"),
    (["--ray-address", "http://127.0.0.1:8265"], "--ray-address"),
])
def test_bad_values_exit_2_naming_the_flag(captured, extra, flag, capsys):
    assert main(_tune(*extra)) == 2
    assert f"error: {flag}:" in capsys.readouterr().err


def test_trial_flags_refused_for_ppo_and_taken_by_every_search(captured, capsys):
    assert main(_tune("--max-concurrent", "2", method="ppo")) == 2
    assert "error: --max-concurrent: only for the searches" in capsys.readouterr().err
    for method in ("random", "grid", "local-asha"):
        with pytest.raises(_Called) as got:
            main(_tune("--ray-address", "auto", "--max-concurrent", "2", method=method))
        assert got.value.kwargs["tune"] == TuneOptions(ray_address="auto", max_concurrent=2)


def test_search_passes_the_options_to_tune_search(monkeypatch):
    """rl.tuner.run.search hands its `tune` options and plan to tune_search unchanged."""
    import rl.tuner.tune_search as ts
    from rl.kernel.settings import TunerSettings
    from rl.tuner.plan import SearchPlan
    from rl.tuner.run import search

    def fake(ev, space, plan, **kwargs):
        raise _Called({"plan": plan, **kwargs})

    monkeypatch.setattr(ts, "tune_search", fake)

    class Ev:
        policy = TunerSettings.defaults()
        data = SimpleNamespace(dataset=SimpleNamespace(examples=[]))

    opts = TuneOptions(max_concurrent=3, resources_per_trial={"cpu": 2.0}, reuse_actors=False,
                       ray_address="auto")
    with pytest.raises(_Called) as got:
        search(Ev(), Ev.policy, SearchPlan("tpe", 100), tune=opts)
    assert got.value.kwargs["options"] == opts
    assert got.value.kwargs["plan"] == SearchPlan("tpe", 100)
    from rag.errors import ConfigError

    with pytest.raises(ConfigError, match="budget"):  # only run_tuning fills in a default
        search(Ev(), Ev.policy, SearchPlan("tpe"), tune=opts)


def test_fanout_workers_and_the_environment(monkeypatch):
    """eval/index: --workers wins; a cluster address (flag or $RAY_ADDRESS) means one task per
    CPU (0); a job server's URL in $RAY_ADDRESS is not a cluster to join."""
    import argparse

    from rag.errors import ConfigError
    from serving.cli.cluster import fanout_workers

    def ns(**kw):
        return argparse.Namespace(**{"workers": None, "ray_address": None, **kw})

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert fanout_workers(ns()) is None
    assert fanout_workers(ns(workers=3)) == 3
    assert fanout_workers(ns(ray_address="127.0.0.1:6379")) == 0
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.10:6379")
    assert fanout_workers(ns()) == 0
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.10:8265")
    assert fanout_workers(ns()) is None
    with pytest.raises(ConfigError, match="--workers"):
        fanout_workers(ns(workers=0))


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_out_that_cannot_be_a_directory_exits_2_naming_out(tmp_path, below, capsys):
    """`--out` an existing file (or a path under one): exit 2 naming `--out`, not mkdir's
    traceback; the file is left as it was."""
    f = tmp_path / "afile"
    f.write_text("keep me")
    out = f / below if below else f
    assert main(["tune", "--dataset", "synthetic", "--out", str(out), "--no-mlflow"]) == 2
    assert "error: --out: cannot create directory" in capsys.readouterr().err
    assert f.read_text() == "keep me"
