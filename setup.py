"""Package list for setuptools (everything else is in pyproject.toml).

Every package under src/, plus `ragpilot_configs`: the top-level configs/ folder, mapped in by
pyproject's `[tool.setuptools.package-dir]` so that the wheel ships the one copy of the defaults
users read and edit (rag/resources.py reads them with importlib.resources). pyproject.toml alone
cannot say "find the packages under src/, and add this folder".
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages("src", include=["rag", "rag.*", "rl", "rl.*", "serving",
                                               "serving.*"]),
                "ragpilot_configs"])
