"""`ragpilot serve | export-interactions`: the Ray Serve app and its interaction log.

    serve               -> serving.launch.run_server(config)   (the Ray Serve app, until SIGTERM)
    export-interactions -> serving.store.open_store(url, create=False).export_jsonl(out)
                           (an existing store only: a mistyped --store exits 2, creating nothing)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rag.errors import ConfigError
from rag.resources import default_config
from serving.cli.common import flags, output_file


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.launch import run_server

    if args.drain_timeout < 0:
        raise ConfigError("--drain-timeout", f"is {args.drain_timeout:g}; must be >= 0 s")
    return run_server(args.config, host=args.host, port=args.port,
                      private_netns=args.private_netns, proxy=args.proxy,
                      drain_timeout_s=args.drain_timeout)


def cmd_export_interactions(args: argparse.Namespace) -> int:
    from serving.store import open_store

    if "://" not in args.store and Path(args.out).resolve() == Path(args.store).resolve():
        raise ConfigError("--out", f"{args.out} is the store itself; write the export "
                                   "elsewhere")
    output_file(args.out, "--out", "JSONL")
    with flags({"store_url": "--store"}):
        store = open_store(args.store, create=False)  # a mistyped path: an error, no new file
    try:
        n = store.export_jsonl(args.out, include_shadow=not args.no_shadow)
    finally:
        store.close()
    print(f"wrote {n} interactions to {args.out}")
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("serve", help="run the Ray Serve app (same YAML as `serve run`)")
    s.add_argument("--config", default=str(default_config("serve/default.yaml")),
                   help="Serve YAML (default: the shipped configs/serve/default.yaml)")
    s.add_argument("--host", help="HTTP host (default: the YAML's, else 127.0.0.1)")
    s.add_argument("--port", type=int)
    s.add_argument("--private-netns", action="store_true",
                   help="run Ray inside a private network namespace (needs CAP_SYS_ADMIN)")
    s.add_argument("--proxy", choices=("serve", "haproxy"), default=None,
                   help="what answers on the HTTP port: Serve's Python proxy (default) or "
                        "HAProxy in front of the ingress replicas (needs the haproxy binary; "
                        "docs/serving.md)")
    s.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, wait at most this long for the requests in flight "
                        "before stopping (a second signal stops at once; default 30)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("export-interactions", help="interaction log -> JSONL for training")
    s.add_argument("--store", default="runs/serve/interactions.sqlite",
                   help="SQLite path or SQLAlchemy URL")
    s.add_argument("--out", required=True)
    s.add_argument("--no-shadow", action="store_true", help="leave shadow answers out")
    s.set_defaults(func=cmd_export_interactions)
