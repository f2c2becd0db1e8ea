"""serving.serve_yaml: the Serve config `ragpilot tune` and `ragpilot policy train` write next
to their run. What is checked is what the app would deploy: the file passes the same checks as
`ragpilot serve --config` (read_serve_yaml, then ServeSettings), stable is exactly the default
config, the canary exactly the tuned one, and every path is absolute."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rag.errors import ConfigError
from rl.tuner.settings import TunerSettings
from rl.tuner.space import ConfigSpace
from serving.launch import read_serve_yaml
from serving.schemas import ServeSettings
from serving.serve_yaml import policy_args, tuned_args, write_serve_yaml


def _deployed(path: Path) -> ServeSettings:
    _, apps = read_serve_yaml(path)
    return ServeSettings.from_args(apps[0]["args"])


def test_a_tuned_run_serves_default_as_stable_and_the_tuned_config_as_a_0pct_canary(tmp_path,
                                                                                    monkeypatch):
    default = ConfigSpace(TunerSettings.defaults()).base
    tuned = default.model_copy(update={"variant": "bm25", "k": 4})
    data = tmp_path / "my-data"
    data.mkdir()
    monkeypatch.chdir(tmp_path)  # relative run and data paths come out absolute
    path = write_serve_yaml(tmp_path / "serve.yaml",
                            tuned_args("my-data", default, tuned, Path("runs/t")), note="test")
    s = _deployed(path)
    assert s.config(s.stable).config_hash == default.config_hash
    assert s.config(s.canary).config_hash == tuned.config_hash
    assert set(s.canary) == {"variant", "k"}  # only what the tuning changed
    assert s.shadow is None and s.traffic.mode == "split" and s.traffic.canary_percent == 0.0
    assert s.dataset == str(data) and Path(s.rollout_dir) == tmp_path / "runs" / "t" / "rollout"
    assert Path(s.store_url).is_absolute()
    # API keys stay where `ragpilot keys create` (no --config) writes them
    assert s.auth.keys_file == ServeSettings().auth.keys_file
    text = path.read_text()
    assert text.startswith("# Written by ragpilot: test") and f"--config {path}" in text
    # the rest of the packaged template is kept (HTTP on loopback, the app's import path)
    assert yaml.safe_load(text)["http_options"]["host"] == "127.0.0.1"


def test_a_policy_run_serves_the_policy_directory(tmp_path):
    base = TunerSettings.defaults().base_config()
    s = _deployed(write_serve_yaml(tmp_path / "serve.yaml",
                                   policy_args("synthetic", base, tmp_path / "pol")))
    assert s.traffic.mode == "policy" and s.policy.dir == str((tmp_path / "pol").resolve())
    assert s.dataset == "synthetic" and s.canary is None
    assert s.config(s.stable).config_hash == base.config_hash


def test_invalid_args_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="canary"):
        write_serve_yaml(tmp_path / "serve.yaml", {"canary": {"k": 99}})
    assert not (tmp_path / "serve.yaml").exists()
