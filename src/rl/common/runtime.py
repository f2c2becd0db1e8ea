"""The Ray runtime every control-plane job shares: local by default, a cluster when RAY_ADDRESS is
set."""

from __future__ import annotations

import os

SERVE_PROXY_READY_ENV, SERVE_PROXY_READY_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30"
WORKER_NICENESS_ENV, WORKER_NICENESS = "RAY_worker_niceness", "0"
LOCAL_CLUSTER_ENV = {SERVE_PROXY_READY_ENV: SERVE_PROXY_READY_S,
                     WORKER_NICENESS_ENV: WORKER_NICENESS}
"""What every local cluster this project starts is started with, unless the user set it (here,
and `serving.launch.start_local`; a cluster it joins keeps its own). Measured: `make demo`'s
serve stage failed whenever a benchmark kept both cores busy beside it.

- Ray starts its workers at niceness 15, so Tune's trials and Serve's replicas and proxy,
  where the work is, yield to any other busy process: beside two busy benchmark processes,
  Serve's new proxy worker took 58 s from its start to "Proxy starting". Niceness 0 (what
  Ray's own job supervisor runs at) gives them a fair share.
- Serve's controller kills a proxy that has not answered its readiness check within 5 s (three
  checks; the log says "readiness check ... didn't complete in 5.0s") and `serve.start` fails
  with ActorDiedError ("The actor never ran"). 30 s stays under `serve.start`'s own 60 s wait,
  so a proxy that never starts still fails with Serve's timeout message.

The controller and workers read these from the environment the cluster was started with."""


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
    for var, value in LOCAL_CLUSTER_ENV.items():
        os.environ.setdefault(var, value)
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", configure_logging=True,
             object_store_memory=200 * 1024 * 1024)
