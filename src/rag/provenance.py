"""Provenance of a logged run: the code commit and the dataset manifest's sha256s, as MLflow
tags (searchable: `tags.code_commit = '...'`, `tags.dataset_manifest_sha256 = '...'`).

Every MLflow run the project logs (rl.common.tracking's eval and tuning runs, the demo, the rollout
transitions, the trainers) sets these, so a number in MLflow can be traced to the code and the
exact input files. Lives in rag (not rl) so both layers can use it.

    tags = provenance_tags(dataset.manifest_dict())
    # {"code_commit": "3f2a…", "dataset": "hotpotqa", "dataset_manifest_sha256": "…",
    #  "dataset_sha256/hotpotqa/dev.jsonl": "…", ...}
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"
_TAG_KEY = re.compile(r"[^A-Za-z0-9_\-./ ]")


@lru_cache(maxsize=1)
def code_commit() -> str:
    """`git rev-parse HEAD` of the checkout this code runs from, with `+dirty` when tracked
    files differ from it; "unknown" outside a git checkout (e.g. an installed wheel)."""
    cwd = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=cwd, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, cwd=cwd,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return f"{head}+dirty" if dirty else head


def manifest_sha256(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys): one id for the whole data set."""
    blob = json.dumps(dict(manifest), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def input_sha256s(manifest: Mapping[str, Any]) -> dict[str, str]:
    """path -> sha256 of every input file the manifest lists (`inputs: [{path, sha256}]`)."""
    out = {}
    for item in manifest.get("inputs") or []:
        if isinstance(item, Mapping) and item.get("sha256"):
            out[str(item.get("path", "?"))] = str(item["sha256"])
    return out


def provenance_tags(manifest: Mapping[str, Any] | None) -> dict[str, str]:
    """MLflow tags: code_commit, dataset, dataset_manifest_sha256, corpus_fingerprint (when
    known) and one `dataset_sha256/<path>` per input file."""
    m = dict(manifest or {})
    tags = {"code_commit": code_commit(), "dataset": str(m.get("dataset", UNKNOWN)),
            "dataset_manifest_sha256": manifest_sha256(m) if m else UNKNOWN}
    if m.get("corpus_fingerprint"):
        tags["corpus_fingerprint"] = str(m["corpus_fingerprint"])
    for path, sha in input_sha256s(m).items():
        tags[_TAG_KEY.sub("_", f"dataset_sha256/{_tag_path(path)}")[:250]] = sha
    return tags


def _tag_path(path: str) -> str:
    """`path` as an MLflow tag-name suffix: MLflow refuses names that would resolve to another
    name as a file path (an absolute path gives `dataset_sha256//tmp/...`), so the root, `.`
    and `..` segments are dropped: `/data/my set/corpus.jsonl` -> `data/my set/corpus.jsonl`."""
    parts = [x for x in Path(path).parts if x not in (Path(path).anchor, ".", "..", "")]
    return "/".join(parts) or "_"
