"""ragpilot's RAG stack: the thing the control plane tunes.

`rag` never imports `rl` or `serving`.
"""

from rag.env import configure_runtime_env

configure_runtime_env()
