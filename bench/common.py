"""Shared benchmark plumbing: the meta block, JSON + markdown output, and the row helpers of
`rl.stats.rows` (rows with bootstrap CIs) under the names every benchmark imports from here.

Every benchmark writes bench/results/<name>.json as
    {"meta": {commit, machine, datasets: {name: {path, sha256}}, seed, ...},
     "rows": [{"dataset", "system", "metric", "value", "ci_low", "ci_high", "n"}, ...]}
and bench/results/<name>.md (a short table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rag.env import configure_runtime_env
from rl.stats.rows import bootstrap_ci, metric_row, plain_row  # noqa: F401  (the row helpers)

# every benchmark imports this module first: the process-wide defaults (threads, offline HF,
# Ray) are set here, once, for all of them (`import rag` itself sets nothing)
configure_runtime_env()

RESULTS = Path(os.environ.get("RAGPILOT_BENCH_RESULTS")
               or Path(__file__).resolve().parent / "results")
"""Where `write_results` writes: bench/results/, or $RAGPILOT_BENCH_RESULTS (a device run writes
into the folder that comes back, then its files are copied into bench/results/)."""
REPO = Path(__file__).resolve().parents[1]


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def head_commit() -> str:
    """The repository's HEAD commit ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parser(doc: str, seed: bool = False) -> argparse.ArgumentParser:
    """The shared command line of a benchmark: its docstring's first line as the description,
    `--quick` (a < 2 minute run writing <name>.quick.*) and, with `seed`, `--seed` (default 0).
    A benchmark adds at most its own two flags."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; writes <name>.quick.*")
    if seed:
        ap.add_argument("--seed", type=int, default=0)
    return ap


def optional_data(paths: dict[str, str]) -> dict[str, Path]:
    """{name: <data root>/relative path} for those of `paths` present here, {} without a data
    root: the `datasets` of `make_meta` for steps that read no evaluation data themselves (the
    ingests of committed device runs), so they run, and their tests pass, without ../shared."""
    from rag.corpus.loaders import data_root
    from rag.errors import DataError

    try:
        root = data_root()
    except DataError:
        return {}
    return {name: root / rel for name, rel in paths.items() if (root / rel).exists()}


def make_meta(seed: int, datasets: dict[str, Path], extra: dict | None = None) -> dict:
    """commit, machine, dataset sha256s (every file under a dataset folder), seed, time."""
    commit, dirty = head_commit(), None
    if commit != "unknown":
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip())
    ds = {}
    for name, p in datasets.items():
        p = Path(p)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        ds[name] = {str(f.relative_to(p.parent)): _sha256(f) for f in files}
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"commit": commit, "src_dirty": dirty, "seed": seed,
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                        "cpus": os.cpu_count(), "memory_gib": round(mem, 1),
                        "threads": os.environ.get("OMP_NUM_THREADS")},
            "datasets": ds, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[1:], **(extra or {})}


def write_results(name: str, rows: list[dict], meta: dict, md_title: str, md_body: str) -> Path:
    """bench/results/<name>.json + .md; a --quick run writes <name>.quick.* (not committed),
    so it never overwrites the committed full results."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{_stem(name, meta)}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    write_markdown(name, meta, md_title, md_body)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return out


def _stem(name: str, meta: dict) -> str:
    return f"{name}.quick" if meta.get("quick") else name


def write_markdown(name: str, meta: dict, md_title: str, md_body: str) -> Path:
    """bench/results/<name>[.quick].md: title, the command, commit, CPUs and seed, the body."""
    path = RESULTS / f"{_stem(name, meta)}.md"
    path.write_text(
        f"# {md_title}\n\n`python bench/{name}.py{' --quick' if meta.get('quick') else ''}` · "
        f"commit {meta['commit'][:10]} · {meta['machine']['cpus']} CPUs · seed {meta['seed']}"
        f"\n\n{md_body}\n")
    return path


CONVERSATIONAL = ("mtrag",)
"""Datasets whose tuner space has the conversation heads (`ConfigSpace(conversational=...)`):
the same space for every bench that searches or probes it."""


def evaluator(ds: str, policy) -> tuple[Any, dict[str, Any]]:
    """(`ds`'s TunerEvaluator, where its cost model came from). `policy`: TunerSettings.

    Latency is priced with the library's cost model, as `ragpilot tune` prices it
    (`rl.kernel.cost_model`, measured by `rl.kernel.cost_measure`): each component measured
    on this machine on first use and kept beside the tuner's rows, so every evaluation of a
    run, and later runs on the same machine, price with the same numbers (delete the file to
    re-measure). No committed result is read. A benchmark stores the model it priced with in
    its results (`cost_model_used`)."""
    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator

    ev = TunerEvaluator(TuningData.open(ds), policy)
    return ev, {"source": "measured", "path": str(ev.cost_model.path)}


def cost_model_used(ev, provenance: dict[str, Any]) -> dict[str, Any]:
    """`provenance` plus the cost model `ev` priced with, as `CostModel.to_dict()` gives it
    (`meta`: machine and time of the last measurement; `components`: every coefficient), so
    a run's latencies can be recomputed from its own results."""
    return {**provenance, **ev.cost_model.to_dict()}
