"""`ragpilot keys create|list|revoke`: API keys of the Serve app's admin endpoints.

    ragpilot keys create --role admin --name ops      # prints the key once; only its hash is kept
    ragpilot keys list [--json]
    ragpilot keys revoke 1a2b3c4d                     # effective on the server's next request

The key file is `--keys-file`, else `auth.keys_file` of the first application in `--config`
(default configs/serve/default.yaml), else runs/serve/api_keys.json. Exit code 2 on bad input
(unknown role, unknown key id), naming the field.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag.errors import ConfigError
from rag.resources import default_config
from serving.auth import ROLES, KeyFile

DEFAULT_CONFIG = str(default_config("serve/default.yaml"))  # shipped; works from a wheel
DEFAULT_KEYS = "runs/serve/api_keys.json"


def keys_path(keys_file: str | None, config: str | None) -> Path:
    """Where the keys live: the flag, else the Serve YAML's `auth.keys_file`, else default."""
    if keys_file:
        return Path(keys_file)
    cfg = Path(config or DEFAULT_CONFIG)
    if config is not None and config != DEFAULT_CONFIG and not cfg.is_file():
        # a mistyped --config must not send the keys to the default file instead
        raise ConfigError("--config", f"file {cfg} does not exist")
    if cfg.exists():
        from serving.launch import read_serve_yaml
        from serving.schemas import ServeSettings

        _, apps = read_serve_yaml(cfg)
        return Path(ServeSettings.from_args(apps[0].get("args")).auth.keys_file)
    return Path(DEFAULT_KEYS)


def cmd_create(args: argparse.Namespace) -> int:
    kf = KeyFile(keys_path(args.keys_file, args.config))
    token, rec = kf.create(args.role, args.name or "")
    print(f"created key {rec.id} (role {rec.role}) in {kf.path}")
    print("send it as `Authorization: Bearer <key>`; it is shown only now:")
    print(token)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    kf = KeyFile(keys_path(args.keys_file, args.config))
    recs = [k.public() for k in kf.keys().values()]
    if args.json:
        print(json.dumps(recs, indent=1))
        return 0
    for r in recs:
        state = "revoked" if r["revoked"] else "active"
        print(f"{r['id']}  {r['role']:<6} {state:<8} {r['name']}")
    if not recs:
        print(f"no keys in {kf.path}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    kf = KeyFile(keys_path(args.keys_file, args.config))
    rec = kf.revoke(args.key_id)
    print(f"revoked key {rec.id} (role {rec.role})")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("keys", help="API keys of the admin endpoints: create | list | revoke")
    ks = p.add_subparsers(dest="keys_cmd", required=True)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("--keys-file", help="key file (default: the Serve YAML's auth.keys_file)")
        s.add_argument("--config", default=DEFAULT_CONFIG, help="Serve YAML to read it from")

    s = ks.add_parser("create", help="create a key and print it once")
    common(s)
    s.add_argument("--role", choices=ROLES, default="admin")
    s.add_argument("--name", help="a label (who or what uses the key)")
    s.set_defaults(func=cmd_create)

    s = ks.add_parser("list", help="ids, roles and states (never the keys)")
    common(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    s = ks.add_parser("revoke", help="revoke a key by id")
    common(s)
    s.add_argument("key_id")
    s.set_defaults(func=cmd_revoke)
