"""The Ray-cluster flags the commands share, checked before any data or Ray work.

    --ray-address ADDR   join this cluster (`auto`, `HOST:PORT`, `ray://HOST:PORT`); default:
                         $RAY_ADDRESS when set (what `ray job submit` gives a job)
    --workers N          eval / index: split the work into N Ray tasks (a local Ray runtime
                         when no cluster is given)
    tune's searches only (any of them runs the search on Ray Tune, rl.tuner.tune_search):
    --max-concurrent N   trials at once (>= 1; 1 = the deterministic default)
    --cpus-per-trial X   CPUs each trial holds (> 0; default 1)
    --reuse-actors B     yes | no: run the next trial in a finished trial's process (default
                         yes; `no` spreads concurrent trials over the nodes)

A bad value raises ConfigError naming the flag, which the CLI prints and exits 2 on.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from rag.errors import ConfigError

_ADDRESS = re.compile(r"^(?:ray://)?(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*):(?P<port>\d{1,5})$")
_BOOLS = {"yes": True, "true": True, "on": True, "1": True,
          "no": False, "false": False, "off": False, "0": False}
TUNE_FLAGS = ("max_concurrent", "cpus_per_trial", "reuse_actors")


def add_ray_address_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", metavar="ADDR",
                   help="join this Ray cluster: auto | HOST:PORT | ray://HOST:PORT "
                        "(default: $RAY_ADDRESS when set)")


def add_workers_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--workers", type=int, metavar="N",
                   help=f"{what} as N Ray tasks (default: one per CPU of the cluster when "
                        "--ray-address/$RAY_ADDRESS is set, else in this process)")


def add_tune_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """--max-concurrent, --cpus-per-trial, --reuse-actors and --ray-address for `tune`."""
    p.add_argument("--max-concurrent", type=str, metavar="N",
                   help="Ray Tune searches: trials at once (default 1: deterministic)")
    p.add_argument("--cpus-per-trial", type=str, metavar="X",
                   help="Ray Tune searches: CPUs each trial holds (default 1)")
    p.add_argument("--reuse-actors", type=str, metavar="yes|no",
                   help="Ray Tune searches: run the next trial in a finished trial's process "
                        "(default yes; no = one process per trial, so concurrent trials "
                        "spread over the nodes)")
    add_ray_address_argument(p)


def check_ray_address(value: str | None) -> str | None:
    """`value` when it is `auto` or HOST:PORT (optionally ray://) with a port in 1..65535;
    None stays None. ConfigError naming --ray-address otherwise."""
    if value is None:
        return None
    v = value.strip()
    if v == "auto":
        return v
    m = _ADDRESS.match(v)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise ConfigError("--ray-address", f"expected auto, HOST:PORT or ray://HOST:PORT, "
                                           f"got {value!r}")
    return v


def ray_address(args: argparse.Namespace) -> str | None:
    """The checked --ray-address, else $RAY_ADDRESS (unchecked: Ray's own) unless it is a job
    server's http(s) URL (what `ray job submit` reads, not a cluster to join), else None."""
    env = os.environ.get("RAY_ADDRESS", "")
    return check_ray_address(getattr(args, "ray_address", None)) or (
        env if env and not env.startswith(("http://", "https://")) else None)


def fanout_workers(args: argparse.Namespace) -> int | None:
    """How many Ray tasks `eval`/`index` split into: --workers (>= 1), else 0 = "one per CPU
    of the cluster" when a cluster address is known, else None (in-process)."""
    n = getattr(args, "workers", None)
    if n is not None:
        if n < 1:
            raise ConfigError("--workers", f"must be >= 1, got {n}")
        return n
    return 0 if ray_address(args) else None


def _int(flag: str, raw: str, low: int) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(flag, f"expected an integer, got {raw!r}") from None
    if n < low:
        raise ConfigError(flag, f"must be >= {low}, got {n}")
    return n


def tune_cluster_options(args: argparse.Namespace, tune_method: bool) -> dict[str, Any]:
    """The keyword arguments `rl.tuner.tune_search.tune_search` takes from the flags
    (`max_concurrent`, `resources_per_trial`, `reuse_actors`, `ray_address`; only those
    given). `tune_method`: whether the chosen method is a search; the three trial flags
    are refused otherwise (ConfigError naming the flag), --ray-address is kept (PPO joins the
    cluster too)."""
    opts: dict[str, Any] = {}
    if args.max_concurrent is not None:
        opts["max_concurrent"] = _int("--max-concurrent", args.max_concurrent, 1)
    if args.cpus_per_trial is not None:
        try:
            cpus = float(args.cpus_per_trial)
        except ValueError:
            raise ConfigError("--cpus-per-trial", f"expected a number, got "
                                                  f"{args.cpus_per_trial!r}") from None
        if not cpus > 0 or cpus != cpus or cpus == float("inf"):
            raise ConfigError("--cpus-per-trial", f"must be a finite number > 0, got "
                                                  f"{args.cpus_per_trial!r}")
        opts["resources_per_trial"] = {"cpu": cpus}
    if args.reuse_actors is not None:
        key = args.reuse_actors.strip().lower()
        if key not in _BOOLS:
            raise ConfigError("--reuse-actors", f"expected yes or no, got {args.reuse_actors!r}")
        opts["reuse_actors"] = _BOOLS[key]
    if opts and not tune_method:
        flag = "--" + next(k for k in TUNE_FLAGS if getattr(args, k) is not None).replace("_", "-")
        raise ConfigError(flag, f"only for the searches (--method local-asha, tpe, ...), "
                                f"not --method {args.method}")
    address = check_ray_address(args.ray_address)
    if address:
        opts["ray_address"] = address
    return opts
