"""Where selection training runs: Ray tasks (the default of `ragpilot select`) or in-process.

    runner = make_runner(local=False, parallel=2)   # Ray: local runtime, or RAY_ADDRESS's cluster
    ref = runner.put(pools)                         # shared inputs go to the object store once
    out = runner.submit(fn, ref, cfg)               # fn(pools, cfg) as a task (num_cpus=1)
    value = runner.get(out)                         # results are gathered in submission order

`RayRunner` joins the runtime already up (a test session's, or the task's own when this runs
inside Ray), else `rl.common.runtime.init_ray`: a local runtime with the machine's CPUs, dashboard off,
loopback only — or the cluster named by `RAY_ADDRESS`, which `ray job submit` sets for its
entrypoint. Object refs passed as top-level arguments are dependencies: a task waits for the
task that produces them, so the driver never blocks on an intermediate result. At most
`parallel` tasks are in flight (2 by default: this machine has 2 cores; raise it on a cluster).

`LocalRunner` calls the same functions in the calling process, in submission order: `put` and
`get` are identities. Both runners call the same functions with the same arguments and seeds, so
they give the same numbers (tests/test_selection_ray.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class LocalRunner:
    """In-process: `submit` runs `fn` at once (the debugging path, `--local`)."""

    kind = "in-process"

    def put(self, obj: Any) -> Any:
        return obj

    def submit(self, fn: Callable[..., Any], *args: Any, num_returns: int = 1) -> Any:
        return fn(*args)

    def get(self, ref: Any) -> Any:
        return ref

    def describe(self) -> str:
        return "in-process (PPO on a local Ray runtime)"


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """The task body: the project's process defaults (OMP/MKL threads, offline Hugging Face,
    loopback Ray) in the worker too, then `fn`. A PPO stage calls `rl.common.runtime.init_ray`, which
    returns at once here (`ray.is_initialized()` is true inside a task): no second runtime."""
    from rag.env import configure_runtime_env

    configure_runtime_env()
    return fn(*args)


class RayRunner:
    """Each `submit` is a Ray task with `num_cpus` CPUs (module docstring)."""

    kind = "ray"

    def __init__(self, parallel: int = 2, num_cpus: float = 1):
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        import ray

        from rl.common.runtime import init_ray

        self.started = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
        init_ray()
        self.parallel = parallel
        self.num_cpus = num_cpus
        self._remote = ray.remote(_call)
        self._in_flight: list[Any] = []

    def put(self, obj: Any) -> Any:
        import ray

        return ray.put(obj)

    def _throttle(self) -> None:
        import ray

        while len(self._in_flight) >= self.parallel:
            _, self._in_flight = ray.wait(self._in_flight, num_returns=1)

    def submit(self, fn: Callable[..., Any], *args: Any, num_returns: int = 1) -> Any:
        self._throttle()
        out = self._remote.options(num_cpus=self.num_cpus, num_returns=num_returns,
                                   max_retries=0).remote(fn, *args)
        self._in_flight.append(out[0] if num_returns > 1 else out)
        return out

    def get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)

    def describe(self) -> str:
        import ray

        cpus = ray.cluster_resources().get("CPU", 0)
        where = "a local runtime" if self.started else "the running cluster/runtime"
        return (f"ray tasks (num_cpus={self.num_cpus} each, at most {self.parallel} in flight) "
                f"on {where} ({cpus:g} CPUs)")


def make_runner(local: bool = False, parallel: int = 2) -> LocalRunner | RayRunner:
    return LocalRunner() if local else RayRunner(parallel=parallel)
