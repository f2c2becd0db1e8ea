"""ragpilot's documented default configs. Edit them here; the wheel ships this folder as the
data-only package `ragpilot_configs` (read with `rag.resources.default_config`)."""
