"""Typed errors. Each names what was wrong (a config field, a file and line) so that the CLI can
exit with code 2 and the HTTP layer can answer 4xx with the same message."""

from __future__ import annotations


class RagError(Exception):
    """Base class of every error ragpilot raises on bad input."""


class ConfigError(RagError, ValueError):
    """A config value or key is invalid. `field` is the dotted path of the offending key;
    `source` and `line` (1-based) say where it was written when it came from a file."""

    def __init__(self, field: str, message: str, source: str | None = None,
                 line: int | None = None):
        self.field = field
        self.message = message
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f" (at {source}:{line})" if line is not None else f" (in {source})"
        super().__init__(f"{field}: {message}{where}")


class DataError(RagError, ValueError):
    """An input file is missing or malformed. `line` is 1-based when known."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ModelNotFoundError(RagError, LookupError):
    """A model name is not in the registry, or its local path does not exist."""

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(f"model {name!r}: {message}")


class CorpusMismatchError(RagError, ValueError):
    """An index directory was built from another corpus than the dataset it is asked to serve.
    Carries both corpus fingerprints (`rag.corpus.Corpus.fingerprint`) and the index root."""

    def __init__(self, root: str, index_fingerprint: str, dataset_fingerprint: str,
                 dataset: str):
        self.root = str(root)
        self.index_fingerprint = index_fingerprint
        self.dataset_fingerprint = dataset_fingerprint
        super().__init__(
            f"{root}: index built from corpus {index_fingerprint}, but {dataset}'s corpus is "
            f"{dataset_fingerprint}; rebuild it with `ragpilot index --dataset {dataset} --out "
            f"<dir>`, or pass the --index built from this dataset")
