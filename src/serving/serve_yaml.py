"""A Serve config for what a run produced, so the step from `ragpilot tune` or
`ragpilot router train` to serving it is one command, not a hand-edited copy of
configs/serve/default.yaml:

    write_serve_yaml(run / "serve.yaml", tuned_args(dataset, default, tuned, run))
    # then: ragpilot serve --config runs/my-tune/serve.yaml

The file is the packaged configs/serve/default.yaml with its first application's `args`
replaced key by key (`args` validated by ServeSettings before anything is written, so a file
written here always deploys) and every path absolute, so it serves from any directory. The
interaction store and the rollout state live under `<run>/serve` and `<run>/rollout`; the API
keys file stays the template's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rag.resources import default_config
from serving.schemas import ServeSettings

SERVE_FILE = "serve.yaml"


def changed_keys(config: Any, default: Any) -> dict[str, Any]:
    """The fields of `config` (a RAGConfig) whose values differ from `default`'s."""
    a, b = config.model_dump(mode="json"), default.model_dump(mode="json")
    return {k: v for k, v in a.items() if b.get(k) != v}


def _run_paths(run: Path) -> dict[str, Any]:
    """The run's own interaction store and rollout state. API keys stay where `ragpilot keys
    create` puts them without `--config` (the template's `auth.keys_file`): an operator's
    credential, not a run's."""
    run = run.resolve()
    return {"store_url": str(run / "serve" / "interactions.sqlite"),
            "rollout_dir": str(run / "rollout")}


def _dataset(dataset: str) -> str:
    """A path as an absolute path (the Serve app runs from any directory); a name as it is."""
    return str(Path(dataset).resolve()) if Path(dataset).exists() else dataset


def tuned_args(dataset: str, default: Any, tuned: Any, run: str | Path) -> dict[str, Any]:
    """Serve `default` as stable and `tuned` as the canary at 0% of traffic: the promotion
    (`ragpilot rollout start --candidate <run>/best_config.yaml`) moves the split on evidence.
    `base` is the default config in full, so stable is exactly the config the run compared
    against and the canary's overrides are only the keys the tuning changed."""
    return {"dataset": _dataset(dataset), "base": default.model_dump(mode="json"),
            "stable": {}, "canary": changed_keys(tuned, default), "shadow": None,
            "traffic": {"mode": "split", "canary_percent": 0.0, "shadow_percent": 0.0},
            **_run_paths(Path(run))}


def policy_args(dataset: str, base: Any, policy_dir: str | Path) -> dict[str, Any]:
    """Serve the per-query policy in `policy_dir` (traffic.mode policy: it picks each request's
    config among its arms and logs the propensity of each pick)."""
    return {"dataset": _dataset(dataset), "base": base.model_dump(mode="json"),
            "stable": {}, "canary": None, "shadow": None,
            "traffic": {"mode": "policy", "canary_percent": 0.0, "shadow_percent": 0.0},
            "policy": {"dir": str(Path(policy_dir).resolve())},
            **_run_paths(Path(policy_dir))}


def write_serve_yaml(path: str | Path, args: dict[str, Any], note: str = "") -> Path:
    """configs/serve/default.yaml with `args` set over its first application's (key by key;
    `traffic` merged one level down), validated, written to `path`."""
    template = default_config("serve/default.yaml")
    data = yaml.safe_load(template.read_text())
    app = data["applications"][0]
    merged = dict(app.get("args") or {})
    for k, v in args.items():
        merged[k] = ({**(merged.get(k) or {}), **v}
                     if k == "traffic" and isinstance(v, dict) else v)
    ServeSettings.from_args(merged)  # ConfigError naming serve.<key> before anything is written
    app["args"] = merged
    path = Path(path)
    head = (f"# Written by ragpilot{': ' + note if note else ''}.\n"
            f"# Serve it: ragpilot serve --config {path}   (or: serve run {path})\n"
            "# Every key: configs/serve/default.yaml (serving.schemas.ServeSettings).\n")
    path.write_text(head + yaml.safe_dump(data, sort_keys=False))
    return path
