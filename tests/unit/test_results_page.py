"""docs/results.md is generated from bench/results (scripts/results_page.py) and is current."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _page_module():
    spec = importlib.util.spec_from_file_location("results_page",
                                                  ROOT / "scripts" / "results_page.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_results_page_is_current():
    page = _page_module()
    assert (ROOT / "docs" / "results.md").read_text() == page.render(), \
        "docs/results.md is stale: run python scripts/results_page.py"


def test_page_renders_rows_cis_plots_and_skips_other_json(tmp_path):
    page = _page_module()
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    (tmp_path / "bench" / "demo.py").write_text("")
    rows = [{"dataset": "d", "system": "s", "metric": "m", "value": 0.12345, "ci_low": 0.1,
             "ci_high": 0.2, "n": 300},
            {"dataset": "d", "system": "s", "metric": "count", "value": 1234.0, "ci_low": None,
             "ci_high": None, "n": None, "seed": 3}]
    (res / "demo.json").write_text(json.dumps({"meta": {"commit": "abc", "seed": 0},
                                               "rows": rows}))
    (res / "sample.json").write_text(json.dumps({"tuned_config": {}}))  # not a results file
    (res / "demo-curve.png").write_bytes(b"")
    retired = tmp_path / "retired.md"
    retired.write_text("## Retired studies\n\n- x: found y.\n")
    text = page.render(res, retired)
    assert "## demo" in text and "## sample" not in text
    assert "Written by `python bench/demo.py`." in text
    assert "| d | s | m | 0.1235 [0.1000, 0.2000] | 300 |" in text
    assert "| d | s | count (seed 3) | 1,234 | n/a |" in text
    assert "![demo-curve.png](../bench/results/demo-curve.png)" in text
    assert text.rstrip().endswith("- x: found y.")
    assert page.render(res, retired) == text  # a pure function of its inputs
