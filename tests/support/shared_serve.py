"""One in-process Ray + Serve runtime shared by the test modules that deploy the real app with
Serve's own proxy (tests/conftest.py `serve_app`): Ray starts once, inside a private network
namespace when permitted (`serving.netns`), and each module deploys its own application on it
with its own store, so no module sees another's state.

`SharedServe.deploy(args)` deletes every application left on the runtime (an earlier module's
app and anything it deployed) and deploys `build_app(args)` as `ragpilot` on the runtime's one
HTTP port; it returns the base URL once the app is ready. A runtime that is gone (a module
called `stop_local`, e.g. to restart Serve or to run its own server) or that runs another proxy
(HAProxy is chosen when the cluster starts) is started again first. `proxy="haproxy"` always gets
a fresh cluster of its own. `stop()` shuts Serve and Ray down (`serving.launch.stop_local`).
"""

from __future__ import annotations

import os
import time
from typing import Any

APP = "ragpilot"


class SharedServe:
    """The session's Serve runtime; counts its Ray starts (`starts`) and deploys (`deploys`)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.proxy: str | None = None
        self.starts = 0
        self.deploys = 0

    def _running(self, proxy: str) -> bool:
        import ray

        from serving.launch import HAPROXY_ENV

        return (ray.is_initialized() and self.port is not None and self.proxy == proxy
                and (os.environ.get(HAPROXY_ENV) == "1") == (proxy == "haproxy"))

    def deploy(self, args: dict[str, Any], proxy: str = "serve") -> str:
        """Deploy the app of `args` (`serving.app.build_app`) on the shared runtime, starting
        or restarting the runtime when needed (module doc); returns `http://127.0.0.1:PORT`.
        `proxy`: `serve` or `haproxy` (`serving.launch.PROXIES`); haproxy always restarts."""
        import ray
        from ray import serve

        from serving import netns
        from serving.app import build_app
        from serving.launch import start_local, stop_local

        app = build_app(args)  # bad settings fail before anything is torn down
        t0 = time.perf_counter()
        if self._running(proxy) and proxy == "serve":
            for name in list(serve.status().applications):
                serve.delete(name)
            url = start_local(args, port=self.port, proxy=proxy, app=app, name=APP)
            how = "redeployed on the running runtime"
        else:
            if ray.is_initialized():  # another module's cluster, or Ray outside the namespace
                stop_local()
            if not netns.in_private_netns() and not netns.enter_private_netns():
                print(f"serving test not isolated ({netns.last_error}); HTTP on 127.0.0.1 only")
            self.port, self.proxy = netns.free_port(), proxy
            url = start_local(args, port=self.port, proxy=proxy, app=app, name=APP)
            self.starts += 1
            how = "Ray + Serve started"
        self.deploys += 1
        print(f"serve app ready in {time.perf_counter() - t0:.1f} s ({how}; private netns: "
              f"{netns.in_private_netns()}; Ray starts {self.starts}, deploys {self.deploys})")
        return url

    def restart(self, args: dict[str, Any]) -> str:
        """Shut Serve and Ray down and start them again with the app of `args` (a real restart
        of the process's cluster, as after a crash); returns the new base URL."""
        self.stop()
        return self.deploy(args)

    def stop(self) -> None:
        """Shut Serve and Ray down (`serving.launch.stop_local`); a later `deploy` starts again."""
        from serving.launch import stop_local

        t0 = time.perf_counter()
        stop_local()
        self.port = self.proxy = None
        print(f"serve runtime stopped in {time.perf_counter() - t0:.1f} s")
