"""Distilled reward model: a Bradley–Terry logistic model on cheap features of
(question, contexts, answer), trained on pairwise preferences of a judge (by default the
QualityScorer metric judge, rag.metrics.judge.MetricJudgeBackend).

Why: the QualityScorer encodes every claim and context sentence with MiniLM (~10 answers/s on
one core); the tuner needs thousands of evaluations. The features below are lexical and cached
per passage, so scoring runs at thousands of answers/s, and the model is a dot product.

    P(answer i preferred over j) = sigmoid(w · (z(f_i) - z(f_j))),   z = standardisation

`RewardModel.score(question, contexts, answer) -> float` (higher is better; only differences
between answers to the same question are meaningful), `score_batch(items)`,
`RewardModel.fit(X_winner, X_loser)`, `save(root, name)` -> `<root>/<name>/v<k>/`
{manifest.json, weights.npz}, and `load_reward_model(path_or_name)`.

Loading by name searches `search_roots()` in order: $RAGPILOT_REWARD_MODELS (when set: it wins),
<ragpilot cache>/reward_models (where `save()` writes by default), then the models shipped with
the code (package data `rag/bundled/reward_models`: a few hundred bytes of weights, trained by the retired
`quality` study of docs/retired_studies.md), so `quality-rm` resolves in a clean checkout and an installed wheel. `load_default()` is the project's installed model (DEFAULT_NAME), used by
the generator's preference ranker `auto` (rl.adaptation.prefs).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag.errors import ConfigError, DataError
from rag.metrics.claims import (
    content_tokens,
    has_negation,
    is_factoid,
    is_noncommittal,
    is_yes_no,
    key_tokens,
    split_sentences,
    strip_citations,
)
from rag.metrics.qa import normalize_answer
from rag.metrics.support import _covered, _passage
from rag.resources import bundled
from rag.types import Answer, Context

__all__ = ["BUNDLED_ROOT", "DEFAULT_NAME", "FEATURES", "FORMAT_VERSION", "RewardModel",
           "answer_features", "default_root", "find_reward_model", "load_default",
           "load_reward_model", "search_roots"]

FORMAT_VERSION = 1
DEFAULT_NAME = "quality-rm"
BUNDLED_ROOT = bundled("reward_models").resolve()
"""The reward models shipped with the code (package data; trained by the retired `quality` study)."""
FEATURES = (
    "abstain",             # an abstention ("insufficient context", "I don't know", ...)
    "yes_no",              # a bare yes/no
    "factoid",             # short non-sentence answer
    "log_words",           # log(1 + words)
    "lex_support",         # answer content stems found anywhere in the contexts
    "best_passage_cover",  # max over passages of the share of answer stems it holds
    "answer_in_context",   # normalised answer occurs verbatim in a context
    "sent_support",        # answer sentences whose best context sentence holds >= 60% of stems
    "missing_entities",    # entity/number stems found in no context (capped at 5)
    "missing_entity_frac",  # ... as a share of the answer's entity stems
    "negation_unmatched",  # the answer negates, no context sentence does
    "q_copy",              # answer stems that are question stems (restating the question)
    "q_cover",             # question stems the answer mentions
)


def _ctx(c) -> tuple[str, str]:
    if isinstance(c, Context):
        return c.title or "", c.text or ""
    if isinstance(c, str):
        return "", c
    raise ConfigError("contexts", f"expected Context or str, got {type(c).__name__}")


def answer_features(question: str, contexts: Sequence[Context | str], answer: str) -> np.ndarray:
    """The FEATURES vector of one answer (float64). Passage parsing is cached (lru) across
    answers, so answers to the same question share that work."""
    text = strip_citations(answer or "")
    ps = [_passage(*_ctx(c)) for c in contexts]
    pool = frozenset().union(*(p.tokens for p in ps)) if ps else frozenset()
    toks = set(content_tokens(text))
    qtoks = set(content_tokens(question or ""))
    abstain = is_noncommittal(text)
    f = np.zeros(len(FEATURES))
    f[0] = abstain
    f[1] = is_yes_no(text)
    f[2] = is_factoid(text)
    f[3] = math.log1p(len(text.split()))
    if toks and not abstain:
        f[4] = sum(t in pool for t in toks) / len(toks)
        f[5] = max((len(toks & p.tokens) / len(toks) for p in ps), default=0.0)
        norm = normalize_answer(text)
        f[6] = bool(norm) and any(f" {norm} " in p.norm for p in ps)
        sents = split_sentences(text) or [text]
        units = [u for p in ps for u in p.unit_tokens]
        ok = 0
        for s in sents:
            st = set(content_tokens(s))
            if st and units and max(len(st & u) for u in units) / len(st) >= 0.6:
                ok += 1
        f[7] = ok / len(sents)
        keys = key_tokens(text)
        miss = sum(not _covered(k, pool) for k in keys)
        f[8] = min(miss, 5)
        f[9] = miss / len(keys) if keys else 0.0
        f[10] = has_negation(text) and not any(g for p in ps for g in p.unit_negated)
        f[11] = len(toks & qtoks) / len(toks)
        f[12] = len(toks & qtoks) / len(qtoks) if qtoks else 0.0
    return f


@dataclass
class RewardModel:
    """Bradley–Terry scorer (module docstring). `weights` apply to standardised features."""

    weights: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    features: tuple[str, ...] = FEATURES
    manifest: dict = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)  # version folder, once saved/loaded

    def __post_init__(self):
        if tuple(self.features) != FEATURES:
            raise ConfigError("features", f"model features {list(self.features)} differ from "
                                          f"this code's {list(FEATURES)}")
        for k in ("weights", "mean", "scale"):
            v = np.asarray(getattr(self, k), dtype=np.float64)
            if v.shape != (len(FEATURES),):
                raise ConfigError(k, f"expected shape ({len(FEATURES)},), got {v.shape}")
            setattr(self, k, v)

    # ---- scoring ---------------------------------------------------------------------------
    def score_features(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        return ((X - self.mean) / self.scale) @ self.weights

    def score(self, question: str, contexts: Sequence[Context | str], answer: str) -> float:
        return float(self.score_features(answer_features(question, contexts, answer))[0])

    def score_batch(self, items: Sequence[tuple[str, Sequence[Context | str], str]]
                    ) -> np.ndarray:
        """(question, contexts, answer) triples -> scores."""
        if not items:
            return np.zeros(0)
        return self.score_features(np.stack([answer_features(*it) for it in items]))

    def score_answer(self, answer: Answer) -> float:
        """An `Answer` record: its question, text and the contexts it was given."""
        return self.score(answer.question, answer.contexts, answer.text)

    def prefer(self, question: str, contexts, a: str, b: str) -> float:
        """P(a preferred over b)."""
        d = self.score(question, contexts, a) - self.score(question, contexts, b)
        return 1.0 / (1.0 + math.exp(-d))

    # ---- training --------------------------------------------------------------------------
    @classmethod
    def fit(cls, X_win: np.ndarray, X_lose: np.ndarray, l2: float = 1.0, iters: int = 50,
            manifest: dict | None = None) -> RewardModel:
        """Maximum-likelihood Bradley–Terry weights (Newton's method, L2 penalty `l2` on the
        standardised weights) from paired feature rows: row k of X_win was preferred over row
        k of X_lose. Both orientations are used, so there is no intercept to learn."""
        X_win, X_lose = np.asarray(X_win, float), np.asarray(X_lose, float)
        if X_win.shape != X_lose.shape or X_win.ndim != 2 or X_win.shape[1] != len(FEATURES):
            raise ConfigError("pairs", f"need two (n, {len(FEATURES)}) arrays, got "
                                       f"{X_win.shape} and {X_lose.shape}")
        if len(X_win) == 0:
            raise ConfigError("pairs", "no preference pairs to train on")
        allx = np.vstack([X_win, X_lose])
        mean = allx.mean(axis=0)
        scale = allx.std(axis=0)
        scale[scale < 1e-9] = 1.0
        D = (X_win - X_lose) / scale
        D = np.vstack([D, -D])
        y = np.r_[np.ones(len(X_win)), np.zeros(len(X_win))]
        w = np.zeros(D.shape[1])
        for _ in range(iters):
            p = 1.0 / (1.0 + np.exp(-(D @ w)))
            g = D.T @ (p - y) + l2 * w
            H = (D * (p * (1 - p))[:, None]).T @ D + l2 * np.eye(len(w))
            step = np.linalg.solve(H, g)
            w -= step
            if np.abs(step).max() < 1e-8:
                break
        return cls(w, mean, scale, FEATURES, dict(manifest or {}))

    def agreement(self, X_a: np.ndarray, X_b: np.ndarray, y: np.ndarray) -> float:
        """Share of pairs where the model prefers the side `y` names (1: a, 0: b); a score
        tie counts half."""
        d = self.score_features(X_a) - self.score_features(X_b)
        y = np.asarray(y)
        return float(np.mean(np.where(d == 0, 0.5, (d > 0) == (y == 1))))

    # ---- persistence -----------------------------------------------------------------------
    def save(self, root: str | Path | None = None, name: str = "quality-rm") -> Path:
        """Write `<root>/<name>/v<k>/` (k = 1 + the highest existing version) with
        manifest.json (name, version, format, features, created, the `manifest` given at
        training: data hashes, metrics, teacher...) and weights.npz. Returns the folder."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ConfigError("name", f"{name!r}: letters, digits, '.', '_' and '-' only")
        base = Path(root or default_root()) / name
        base.mkdir(parents=True, exist_ok=True)
        versions = [int(p.name[1:]) for p in base.glob("v*") if p.name[1:].isdigit()]
        out = base / f"v{max(versions, default=0) + 1}"
        tmp = base / f".{out.name}.tmp{os.getpid()}"
        tmp.mkdir()
        np.savez(tmp / "weights.npz", weights=self.weights, mean=self.mean, scale=self.scale)
        digest = hashlib.sha256((tmp / "weights.npz").read_bytes()).hexdigest()
        man = {**self.manifest, "name": name, "version": int(out.name[1:]),
               "format_version": FORMAT_VERSION, "kind": "bradley-terry-logistic",
               "features": list(FEATURES), "weights_sha256": digest,
               "weights": {f: float(w) for f, w in zip(FEATURES, self.weights, strict=True)},
               "created": self.manifest.get("created") or time.strftime(
                   "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "manifest.json").write_text(json.dumps(man, indent=1) + "\n")
        tmp.rename(out)
        self.manifest, self.path = man, out
        return out


def default_root() -> Path:
    """Where models are saved by default: $RAGPILOT_REWARD_MODELS, else
    <ragpilot cache>/reward_models."""
    env = os.environ.get("RAGPILOT_REWARD_MODELS")
    if env:
        return Path(env)
    from rag.models import cache_dir

    return cache_dir() / "reward_models"


def search_roots() -> list[Path]:
    """Where a name is looked up, first match wins: $RAGPILOT_REWARD_MODELS (when set),
    <ragpilot cache>/reward_models, BUNDLED_ROOT (the shipped models, when present)."""
    from rag.models import cache_dir

    roots = []
    env = os.environ.get("RAGPILOT_REWARD_MODELS")
    if env:
        roots.append(Path(env))
    roots.append(cache_dir() / "reward_models")
    if BUNDLED_ROOT.is_dir():
        roots.append(BUNDLED_ROOT)
    return list(dict.fromkeys(roots))


def _is_model(p: Path) -> bool:
    """A version folder (manifest.json) or a model folder holding v<k>/manifest.json."""
    return (p / "manifest.json").exists() or (p.is_dir() and any(
        v.name[1:].isdigit() and (v / "manifest.json").exists() for v in p.glob("v*")))


def find_reward_model(name: str = DEFAULT_NAME, root: str | Path | None = None) -> Path | None:
    """The folder a name (optionally "name/v3") resolves to: under `root` when given, else the
    first of `search_roots()` holding it; None when no root does."""
    for r in [Path(root)] if root else search_roots():
        if _is_model(r / name):
            return r / name
    return None


def load_default(name: str = DEFAULT_NAME) -> RewardModel:
    """The installed reward model `name` (see `search_roots()`); DataError naming the places
    searched when there is none."""
    p = find_reward_model(name)
    if p is None:
        raise DataError(name, "no saved reward model under " +
                        ", ".join(str(r) for r in search_roots()))
    return load_reward_model(p)


def load_reward_model(path_or_name: str | Path, root: str | Path | None = None) -> RewardModel:
    """A saved model: a version folder (holding manifest.json), a model folder (its highest
    v<k> is taken), or a name looked up under `root` (default: `search_roots()`, first match),
    optionally "name/v3". Checks the format version, the feature list and the weights' sha256.
    The loaded model's `path` is the version folder it came from."""
    p = Path(path_or_name)
    if not (p / "manifest.json").exists() and not p.is_dir():
        p = find_reward_model(str(path_or_name), root) or \
            Path(root or default_root()) / str(path_or_name)
    if p.is_dir() and not (p / "manifest.json").exists():
        versions = sorted((int(v.name[1:]), v) for v in p.glob("v*")
                          if v.name[1:].isdigit() and (v / "manifest.json").exists())
        if not versions:
            raise DataError(str(p), "no saved reward model version (v<k>/manifest.json) here")
        p = versions[-1][1]
    if not (p / "manifest.json").exists():
        raise DataError(str(p), "no reward model here (manifest.json missing)")
    try:
        man = json.loads((p / "manifest.json").read_text())
    except ValueError as exc:
        raise DataError(str(p / "manifest.json"), f"malformed JSON: {exc}") from None
    if man.get("format_version") != FORMAT_VERSION:
        raise DataError(str(p / "manifest.json"), f"format_version {man.get('format_version')!r}"
                                                  f" (this code reads {FORMAT_VERSION})")
    if tuple(man.get("features") or ()) != FEATURES:
        raise DataError(str(p / "manifest.json"), "features differ from this code's FEATURES")
    raw = (p / "weights.npz").read_bytes()
    if hashlib.sha256(raw).hexdigest() != man.get("weights_sha256"):
        raise DataError(str(p / "weights.npz"), "sha256 does not match the manifest")
    with np.load(p / "weights.npz") as z:
        rm = RewardModel(z["weights"], z["mean"], z["scale"], FEATURES, man)
    rm.path = p
    return rm
