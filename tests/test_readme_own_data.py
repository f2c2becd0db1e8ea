"""The README's "Tune your own data" block, run as written (issue 22): every line of the fenced
block after the `own-data` marker runs in bash with `D` pointing at a BEIR folder made here, and
the path ends with a holdout report that compares the tuned config with the default."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.test_tune_own_data import _beir

from rag.config import RAGConfig
from serving.launch import read_serve_yaml
from serving.schemas import ServeSettings

README = Path(__file__).resolve().parents[1] / "README.md"


def _own_data_block() -> list[str]:
    text = README.read_text()
    m = re.search(r"<!-- own-data:[^\n]*-->\n```bash\n(.*?)```", text, flags=re.S)
    assert m, "README lost its own-data block (the marker comment and a bash fence)"
    return [line for line in m.group(1).splitlines() if line.strip()]


def test_readme_block_names_the_whole_path():
    lines = _own_data_block()
    commands = [ln.split()[1] for ln in lines if ln.startswith("ragpilot ")]
    assert commands == ["data-report", "tuner-eval", "tune", "report"]


@pytest.mark.slow
def test_readme_own_data_path_runs_as_written(tmp_path):
    data = _beir(tmp_path / "my-data")
    lines = _own_data_block()
    assert lines[0].startswith("D=")
    script = "set -euo pipefail\n" + f"D={data}\n" + "\n".join(lines[1:]) + "\n"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAGPILOT_CACHE": str(tmp_path / "cache"), "MLFLOW_TRACKING_URI": "",
           "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI")
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "my-tune"
    summary = json.loads((run / "summary.json").read_text())
    # `tuner-eval` made the split (into the cache); `tune` found it by content hash and wrote it
    # next to the run
    assert summary["split"]["source"] == "reused" and (run / "split.json").exists()
    assert len(list((tmp_path / "cache" / "splits").glob("*.json"))) == 1
    assert summary["metrics"] == {"faithfulness": "sig_combined", "relevancy": "ndcg@10"}
    report = (run / "report.md").read_text()
    assert "default" in report and "95%" in report
    assert "bm25" in proc.stdout or "hybrid" in proc.stdout or "dense" in proc.stdout  # best_config
    # the README's next step serves the run's serve.yaml: default as stable, tuned as canary
    tuned = RAGConfig.from_yaml(run / "best_config.yaml")
    if (run / "serve.yaml").exists():
        s = ServeSettings.from_args(read_serve_yaml(run / "serve.yaml")[1][0]["args"])
        assert s.config(s.canary).config_hash == tuned.config_hash
        assert s.dataset == str(data.resolve())
        assert "ragpilot serve --config runs/my-tune/serve.yaml" in proc.stdout
    else:  # the search kept the default
        assert "nothing to roll out" in proc.stdout
