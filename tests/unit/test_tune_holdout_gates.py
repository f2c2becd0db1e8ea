"""`ragpilot tune` writes no serve.yaml for a tuned config that fails a hard gate on the
holdout split (a search can meet a gate on the tune split with no margin: 4 of 20 local-asha
picks on MTRAG did, bench/results/search.md), and says which gate, by how much."""

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


def test_no_serve_yaml_for_a_config_that_fails_a_gate_on_the_holdout(tmp_path, capsys):
    settings = TunerSettings.defaults()
    tuned = settings.base_config().replace(variant="graph", k=9)
    run = SimpleNamespace(best=tuned, holdout=_report(), out=tmp_path,
                          summary={"dataset": "mtrag"},
                          evaluator=SimpleNamespace(thresholds=MTRAG))
    _serve_next(run, settings)
    out = capsys.readouterr().out
    assert "not rolled out" in out and "relevancy 0.695 < 0.700" in out
    assert str(tmp_path) in out and not (tmp_path / "serve.yaml").exists()
