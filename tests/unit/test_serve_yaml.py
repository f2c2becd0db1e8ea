"""serving.serve_yaml: the Serve config `ragpilot tune` and `ragpilot router train` write next
to their run. What is checked is what the app would deploy: the file passes the same checks as
`ragpilot serve --config` (read_serve_yaml, then ServeSettings), stable is exactly the default
config, the canary exactly the tuned one, and every path is absolute."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rag.errors import ConfigError
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace
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


def test_a_serve_yaml_a_person_gets_wrong_is_refused_before_ray_starts(tmp_path):
    """Found by an audit (stop 56): tracebacks (http_options a list, a port "abc"), keys Serve
    would ignore (an application's `argz:` served the defaults), a key written twice, two
    applications with one name, and paths the replicas would fail on one by one."""
    import copy

    import yaml

    from rag.errors import ConfigError
    from rag.resources import default_config
    from serving.app import preflight
    from serving.launch import read_serve_yaml

    base = yaml.safe_load(default_config("serve/default.yaml").read_text())
    app_args = base["applications"][0]["args"]

    def broken(change) -> str:
        data = copy.deepcopy(base)
        change(data)
        p = tmp_path / "s.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        with pytest.raises(ConfigError) as e:
            read_serve_yaml(p)
        return e.value.field

    assert broken(lambda d: d.update(http_options=[1, 2])) == "http_options"
    assert broken(lambda d: d["http_options"].update(port="abc")) == "http_options.port"
    assert broken(lambda d: d["http_options"].update(port=-5)) == "http_options.port"
    assert broken(lambda d: d["http_options"].update(bogus=1)) == "http_options.bogus"
    assert broken(lambda d: d.update(bogus_top=1)) == "bogus_top"
    assert broken(lambda d: d["applications"][0].update(argz={})) == "applications.0.argz"
    assert broken(lambda d: d["applications"].append(copy.deepcopy(d["applications"][0]))) \
        == "applications.1.name"
    p = tmp_path / "dup.yaml"
    p.write_text("http_options: {port: 8000}\nhttp_options: {port: 9000}\n")
    with pytest.raises(ConfigError, match="appears twice"):
        read_serve_yaml(p)

    def refused(**args) -> str:
        with pytest.raises(ConfigError) as e:
            preflight({**app_args, "store_url": str(tmp_path / "s.sqlite"), **args})
        return e.value.field

    assert refused(base={"kk": 1}) == "serve.base.kk"  # not serve.stable.kk
    assert refused(store_url=str(tmp_path)) == "serve.store_url"
    assert refused(store_url="ftp://x/y") == "serve.store_url"
    assert refused(auth={"keys_file": str(tmp_path)}) == "serve.auth.keys_file"
    (tmp_path / "f").write_text("x")
    assert refused(rollout_dir=str(tmp_path / "f")) == "serve.rollout_dir"
    assert refused(policy={"dir": str(tmp_path / "nope")}) == "serve.policy.dir"
    assert refused(index_dir=str(tmp_path / "noidx")) == "serve.index_dir"
    preflight({**app_args, "store_url": str(tmp_path / "s.sqlite")})  # the shipped one passes
