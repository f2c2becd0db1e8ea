"""Shared benchmark plumbing: the meta block, JSON + markdown output, and the row helpers of
`rl.stats.rows` (rows with bootstrap CIs) under the names every benchmark imports from here.

Every benchmark writes bench/results/<name>.json as
    {"meta": {commit, machine, datasets: {name: {path, sha256}}, seed, ...},
     "rows": [{"dataset", "system", "metric", "value", "ci_low", "ci_high", "n"}, ...]}
and bench/results/<name>.md (a short table).
"""

from __future__ import annotations

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

RESULTS = Path(__file__).resolve().parent / "results"
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
SEARCH_JSON = RESULTS / "search.json"
"""bench/search.py's committed results: per dataset its best-known config and cost model."""
PINNED = RESULTS.parent.parent / "runs" / "cost-models"
"""Where `evaluator` writes the cost models it prices with (git-ignored)."""


def evaluator(ds: str, policy, search_json: Path = SEARCH_JSON
              ) -> tuple[Any, dict[str, Any]]:
    """(`ds`'s TunerEvaluator, where its cost model came from). Latency is priced with the
    cost model `search_json` stored for `ds` (`meta.details.<ds>.cost_model`, measured by
    bench/search.py and committed), so a rerun on another machine or day gives the same
    rewards; without one, the evaluator's own (measured on first use and cached beside the
    rows: the machine's load that day goes into every reward). `policy`: TunerSettings."""
    import hashlib

    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator

    saved = None
    if search_json.exists():
        details = json.loads(search_json.read_text()).get("meta", {}).get("details", {})
        saved = (details.get(ds) or {}).get("cost_model")
    if not saved:
        ev = TunerEvaluator(TuningData.open(ds), policy)
        return ev, {"source": "measured", "path": str(ev.cost_model.path)}
    text = json.dumps(saved, indent=1, sort_keys=True)
    path = PINNED / f"cost-model-{ds}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    ev = TunerEvaluator(TuningData.open(ds), policy, cost_model=path)
    return ev, {"source": str(search_json), "measured_at": saved.get("meta", {}).get(
        "measured_at"), "components": sorted(saved.get("components", {}))}


def cost_model_used(ev, provenance: dict[str, Any]) -> dict[str, Any]:
    """`provenance` plus the components measured during this run (missing from the pinned
    model: `CostModel` measures a component on first use)."""
    have = set(provenance.get("components", []))
    added = sorted(set(ev.cost_model.components) - have) if have else []
    return {**{k: v for k, v in provenance.items() if k != "components"}, "added": added}
