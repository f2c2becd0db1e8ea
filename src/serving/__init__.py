"""Serving: the Ray Serve app, its traffic splitter and per-query router, the interaction log,
metrics and the `ragpilot` CLI.

Importing it sets nothing: the CLI's `main` and `serving.app.build_app` call
`rag.env.configure_runtime_env()`.
"""
