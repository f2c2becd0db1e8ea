"""Serving: the Ray Serve app, router, feedback store, metrics and the `ragpilot` CLI."""

from rag.env import configure_runtime_env

configure_runtime_env()
