"""The one model-registry writer (rag.model_registry_writer): versions increase, `@best` moves
only on a better score, concurrent writers lose no entry, a failed or killed write never leaves
a corrupt file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from rag.errors import ConfigError
from rag.model_registry_writer import read_registry_file, register_version
from rag.models import ModelRegistry

REPO = Path(__file__).resolve().parents[2]


def _models(reg: Path) -> dict:
    return yaml.safe_load(reg.read_text())["models"]


def test_versions_increase_and_the_file_stays_a_registry(tmp_path):
    reg = tmp_path / "models.yaml"
    got = [register_version(reg, "ce", "cross_encoder", "hf", tmp_path / f"d{i}")
           for i in range(3)]
    assert [r.version for r in got] == [1, 2, 3]
    assert [r.version_name for r in got] == ["ce@v1", "ce@v2", "ce@v3"]
    models = _models(reg)
    assert models["ce"]["path"] == str(tmp_path / "d2")  # the name is the newest version
    assert {k for k in models} == {"ce", "ce@v1", "ce@v2", "ce@v3", "ce@best"}
    assert models["ce@v1"] == {"kind": "cross_encoder", "format": "hf",
                               "path": str(tmp_path / "d0")}
    # another name keeps its own numbering; the reader ignores the `versions:` section
    assert register_version(reg, "gen", "generator", "hf", tmp_path / "g").version == 1
    loaded = ModelRegistry.from_yaml(reg)
    assert loaded.names("cross_encoder") == ["ce", "ce@best", "ce@v1", "ce@v2", "ce@v3"]
    assert loaded.get("gen@v1").kind == "generator"
    # an explicit number (a versioned directory's) is used as is
    r = register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v7", version=7)
    assert r.version == 7 and _models(reg)["ce@v7"]["path"] == str(tmp_path / "v7")
    assert register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "x").version == 8


def test_best_moves_only_on_a_strictly_better_score(tmp_path):
    reg = tmp_path / "models.yaml"

    def put(score, metric="ndcg@10", **kw):
        return register_version(reg, "ce", "cross_encoder", "hf", tmp_path / f"s{score}",
                                metric=metric, score=score, **kw)

    steps = [put(0.4), put(0.7), put(0.5), put(0.7)]  # v4 ties v2: the older version stays
    assert [r.best_version for r in steps] == [1, 2, 2, 2]
    assert [r.best_moved for r in steps] == [True, True, False, False]
    assert _models(reg)["ce@best"]["path"] == str(tmp_path / "s0.7")
    unscored = register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "none")
    assert unscored.best_version == 2 and not unscored.best_moved
    assert put(0.71).best_version == 6
    # scores on another metric are never compared with these: the first one on it is best
    assert put(0.1, metric="recall@5").best_version == 7
    assert put(0.05, metric="recall@5").best_version == 7
    hist = read_registry_file(reg)["versions"]["ce"]
    assert hist["latest"] == 8 and hist["best"] == 7
    assert [h["score"] for h in hist["history"]] == [0.4, 0.7, 0.5, 0.7, None, 0.71, 0.1, 0.05]


def test_lower_is_better_and_the_first_unscored_version(tmp_path):
    reg = tmp_path / "models.yaml"
    first = register_version(reg, "m", "generator", "hf", tmp_path / "a")
    assert first.best_version == 1 and first.best_moved  # a name's first version is @best
    r2 = register_version(reg, "m", "generator", "hf", tmp_path / "b", metric="loss",
                          score=2.0, higher_is_better=False)
    assert r2.best_version == 2  # the first scored version beats an unscored best
    r3 = register_version(reg, "m", "generator", "hf", tmp_path / "c", metric="loss",
                          score=1.5, higher_is_better=False)
    r4 = register_version(reg, "m", "generator", "hf", tmp_path / "d", metric="loss",
                          score=1.9, higher_is_better=False)
    assert (r3.best_version, r4.best_version) == (3, 3)
    with pytest.raises(ConfigError, match="registry.metric"):
        register_version(reg, "m", "generator", "hf", tmp_path / "e", score=1.0)


def test_a_file_from_the_old_writer_is_continued(tmp_path):
    """Files written before the `versions:` section existed: versions are recovered from the
    `<name>@v<N>` keys, other entries and top-level keys are kept."""
    reg = tmp_path / "registry.yaml"
    old = {"kind": "cross_encoder", "format": "hf"}
    reg.write_text(yaml.safe_dump({"models": {
        "ce": {**old, "path": "/m/v2"}, "ce@v1": {**old, "path": "/m/v1"},
        "ce@v2": {**old, "path": "/m/v2"}, "ce@best": {**old, "path": "/m/v1"},
        "other": {"kind": "encoder", "format": "hf", "path": "/o"}}, "note": "kept"}))
    r = register_version(reg, "ce", "cross_encoder", "hf", "/m/v3")
    assert r.version == 3 and r.best_version == 1 and not r.best_moved
    data = read_registry_file(reg)
    assert data["note"] == "kept" and data["models"]["other"]["path"] == "/o"
    assert data["models"]["ce@best"]["path"] == "/m/v1"


def test_concurrent_threads_lose_no_entry(tmp_path):
    reg = tmp_path / "models.yaml"
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(5):
                register_version(reg, "ce", "cross_encoder", "hf", tmp_path / f"t{k}-{i}",
                                 metric="m", score=float(k * 10 + i))
                register_version(reg, f"own-{k}", "generator", "hf", tmp_path / f"o{k}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    models = _models(reg)
    assert {f"ce@v{n}" for n in range(1, 31)} <= set(models)
    assert {models[f"ce@v{n}"]["path"] for n in range(1, 31)} == \
        {str(tmp_path / f"t{k}-{i}") for k in range(6) for i in range(5)}
    for k in range(6):
        assert {f"own-{k}@v{n}" for n in range(1, 6)} <= set(models)
    assert models["ce@best"]["path"] == str(tmp_path / "t5-4")  # the highest score, 54
    assert not list(tmp_path.glob(".models.yaml.*.tmp"))


_WRITER = """
import sys
sys.path[:0] = {paths!r}
from rag.model_registry_writer import register_version
for i in range({n}):
    register_version({reg!r}, "ce", "cross_encoder", "hf", f"/p/{tag}-{{i}}")
"""


def test_concurrent_processes_lose_no_entry(tmp_path):
    reg = tmp_path / "models.yaml"
    paths = [str(REPO / "src"), str(REPO)]
    procs = [subprocess.Popen([sys.executable, "-c",
                               _WRITER.format(paths=paths, n=15, reg=str(reg), tag=tag)])
             for tag in ("a", "b", "c")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    models = _models(reg)
    versions = {k for k in models if k.startswith("ce@v")}
    assert versions == {f"ce@v{n}" for n in range(1, 46)}
    assert {models[v]["path"] for v in versions} == \
        {f"/p/{tag}-{i}" for tag in "abc" for i in range(15)}


def test_a_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    import rag.model_registry_writer as w

    reg = tmp_path / "models.yaml"
    register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v1")
    before = reg.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(w.os, "fsync", boom)  # the new content is in the temp file, unswapped
    with pytest.raises(OSError, match="disk full"):
        register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v2")
    assert reg.read_bytes() == before
    assert not list(tmp_path.glob(".models.yaml.*.tmp"))  # the temp file is removed
    monkeypatch.undo()
    assert register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v2").version == 2


_KILLED = """
import os, sys
sys.path[:0] = {paths!r}
import rag.model_registry_writer as w
def die(fd):  # the process dies mid-write: temp file written, not yet synced nor swapped
    os._exit(9)
w.os.fsync = die
w.register_version({reg!r}, "ce", "cross_encoder", "hf", "/p/killed")
"""


def test_a_process_killed_mid_write_leaves_a_loadable_file(tmp_path):
    reg = tmp_path / "models.yaml"
    register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v1")
    before = reg.read_bytes()
    code = _KILLED.format(paths=[str(REPO / "src"), str(REPO)], reg=str(reg))
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 9
    assert reg.read_bytes() == before
    assert ModelRegistry.from_yaml(reg).get("ce").path == str(tmp_path / "v1")
    # the lock died with the process; the next writer goes on from v1
    assert register_version(reg, "ce", "cross_encoder", "hf", tmp_path / "v2").version == 2
    assert os.path.exists(reg)
