"""`ragpilot tune` writes no serve.yaml for a tuned config that fails a hard gate on the
holdout split (a search can meet a gate on the tune split with no margin: 4 of 20 local-asha
picks on MTRAG did, bench/results/search.md), and says which gate, by how much. Which gates
count follows the objective: the weighted `reward` keeps every hard gate; `min_cost` and
`max_quality` judge quality on the tune split by non-inferiority (their own gates) and keep
the p95 SLO on the holdout."""

from types import SimpleNamespace

from rl.kernel.settings import Thresholds, TunerSettings
from serving.cli.tune import _serve_next, gate_failures

MTRAG = Thresholds(faithfulness=0.75, relevancy=0.70, p95_latency_ms=500.0)


def _report(relevancy=0.695, p95=80.0, rel_ok=False, lat_ok=True):
    return SimpleNamespace(
        faithfulness=0.96, relevancy=relevancy, p95_latency_ms=p95,
        gates={"faithfulness": True, "relevancy": rel_ok, "p95_latency_ms": lat_ok,
               "passed": rel_ok and lat_ok})


def test_gate_failures_name_the_gate_value_and_threshold():
    assert gate_failures(_report(), MTRAG) == ["relevancy 0.695 < 0.700"]
    assert gate_failures(_report(p95=600.0, lat_ok=False), MTRAG) == [
        "relevancy 0.695 < 0.700", "p95_latency_ms 600.0 > 500.0"]
    assert gate_failures(_report(relevancy=0.72, rel_ok=True), MTRAG) == []


def _run(tmp_path, report, better=True):
    tuned = TunerSettings.defaults().base_config().replace(variant="graph", k=9)
    return SimpleNamespace(best=tuned, holdout=report, out=tmp_path,
                           summary={"dataset": "mtrag", "dataset_name": "mtrag",
                                    "split": {"path": None}, "objective": {"better": better}},
                           evaluator=SimpleNamespace(thresholds=MTRAG))


def test_no_serve_yaml_for_a_config_that_fails_a_gate_on_the_holdout(tmp_path, capsys):
    settings = TunerSettings.from_dict({"objective": {"kind": "reward"}})
    _serve_next(_run(tmp_path, _report()), settings)
    out = capsys.readouterr().out
    assert "not rolled out" in out and "relevancy 0.695 < 0.700" in out
    assert str(tmp_path) in out and not (tmp_path / "serve.yaml").exists()


def test_objectives_keep_only_the_latency_slo_on_the_holdout(tmp_path, capsys):
    settings = TunerSettings.defaults()  # min_cost
    assert settings.objective.kind == "min_cost"
    # relevancy below the reward's absolute threshold: not a gate of min_cost
    _serve_next(_run(tmp_path, _report()), settings)
    assert "serve it: ragpilot serve --config" in capsys.readouterr().out
    assert (tmp_path / "serve.yaml").exists()
    (tmp_path / "serve.yaml").unlink()
    # the p95 SLO still binds
    _serve_next(_run(tmp_path, _report(p95=600.0, lat_ok=False)), settings)
    out = capsys.readouterr().out
    assert "not rolled out" in out and "p95_latency_ms 600.0 > 500.0" in out
    assert "relevancy" not in out and not (tmp_path / "serve.yaml").exists()
    # not better on the objective: the default stays
    _serve_next(_run(tmp_path, _report(relevancy=0.72, rel_ok=True), better=False), settings)
    assert "nothing to roll out" in capsys.readouterr().out
    assert not (tmp_path / "serve.yaml").exists()
