"""The Ray runtime every control-plane job shares: local by default, a cluster when RAY_ADDRESS is
set."""

from __future__ import annotations

import os


def init_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Local Ray by default (CPU count from the machine, dashboard off, quiet logs); joins an
    existing cluster at `address` (`auto`, HOST:PORT, ray://HOST:PORT), else at RAY_ADDRESS
    when that is set (`ray job submit` sets it). A runtime already up is kept as it is."""
    import ray

    from rag.env import configure_runtime_env

    configure_runtime_env()
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", configure_logging=True,
             object_store_memory=200 * 1024 * 1024)
