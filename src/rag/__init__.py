"""ragpilot's RAG stack: the thing the control plane tunes.

`rag` never imports `rl` or `serving`. Importing it changes nothing in the process: entry
points (the CLI, the Serve app builder, benchmarks, scripts, tests) call
`rag.env.configure_runtime_env()` for the thread and offline defaults.
"""
