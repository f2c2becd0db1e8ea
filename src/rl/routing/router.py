"""Per-query config choice over a fixed portfolio of K configs ("arms"): the supervised
full-information router and the per-segment lookup table.

Both learn from full-information rows: for every training query the per-query reward of every
arm (`R`, shape (n, K), `rl.kernel.evaluator.TunerEvaluator.per_query_reward`) and, for the
cost constraint, its tokens (`T`, same shape). Neither sees the queries it is scored on.

- `SupervisedRouter`: one `sklearn.ensemble.HistGradientBoostingRegressor` per arm (or, with
  `pooled`, one over the features and the arm's one-hot) predicts each arm's reward from the
  query's features (`rl.routing.features`); the router picks the arm
  with the highest prediction, optionally minus `token_price` × the arm's mean training tokens
  (a Lagrange multiplier on mean tokens: `fit_token_price`). `shrink` blends each prediction
  towards the arm's training mean (0 = always the best static arm of train, 1 = the model).
- `select_router`: model selection over `PARAM_GRID` by the mean realised reward of the
  router's choices on a validation split (never the test split).
- `select_router_cv`: the same by grouped K-fold cross-validation over all the fitting rows
  (train ∪ valid), optionally jointly with a switching `margin`: the router keeps the best
  static arm of those rows unless its predicted gain over it exceeds the margin; the chosen
  router is refitted on every row, and the chosen parameters' out-of-fold predictions are
  kept (`Selection.oof`) to price the router's tokens on (`fit_token_price(scores=)`: a
  price fitted on the refitted router's in-sample predictions buys fewer tokens than it
  should on new queries, where its predictions are as noisy as out of fold). The margins
  tried by default are `CV_MARGINS` (0 only: plain argmax).
- `out_of_fold_scores` / `router_features`: the router's view of a query as observation
  features for a policy stacked on it (the residual PPO policy's `defer` head): its predicted
  reward of its pick, of the best static arm, its margin, the pick's cost and descriptors. On
  the training queries the predictions are out of fold (grouped K-fold: no query's features
  come from a router that trained on it, or on its conversation: `rl.stats.headroom.group_folds`),
  so the stacked policy sees
  the router as good as it is on new queries, not as good as it is on the queries it fitted.
  `stacked` builds those observations for every role of a train / valid / test protocol.
- `SegmentLookup`: the best arm per segment label (`rl.stats.headroom.segment_choice`), the
  best static arm for a label it never saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.stats.headroom import best_static, group_folds, pick, segment_choice


@dataclass(frozen=True)
class RouterParams:
    """Hyper-parameters of the per-arm regressors (sklearn's names) and the shrinkage."""

    max_iter: int = 100
    learning_rate: float = 0.05
    max_leaf_nodes: int = 15
    min_samples_leaf: int = 20
    l2_regularization: float = 1.0
    shrink: float = 1.0
    pooled: bool = False
    """One regressor over (features, arm one-hot) for all arms instead of one per arm: arms
    share what the features say about every arm (helps when train is small)."""


PARAM_GRID: tuple[RouterParams, ...] = (
    RouterParams(max_iter=50, max_leaf_nodes=7, min_samples_leaf=30),
    RouterParams(max_iter=50, max_leaf_nodes=7, min_samples_leaf=30, shrink=0.5),
    RouterParams(max_iter=150, max_leaf_nodes=15, min_samples_leaf=20),
    RouterParams(max_iter=150, max_leaf_nodes=15, min_samples_leaf=20, shrink=0.5),
    RouterParams(max_iter=300, learning_rate=0.03, max_leaf_nodes=31, min_samples_leaf=10),
    RouterParams(max_iter=200, max_leaf_nodes=15, min_samples_leaf=20, pooled=True),
    RouterParams(max_iter=400, max_leaf_nodes=31, min_samples_leaf=20, pooled=True),
)
"""What `select_router` tries: small and larger trees, with and without shrinkage."""


PRICE_SCAN = 120
"""Geometric grid points `SupervisedRouter.fit_token_price` scans before bisecting."""


def _check(X: np.ndarray, M: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    M = np.asarray(M, dtype=np.float64)
    if X.ndim != 2 or M.ndim != 2 or X.shape[0] != M.shape[0] or X.shape[0] < 2:
        raise ConfigError(name, f"needs features (n, d) and a (n, K) matrix with the same n >= 2, "
                                f"got {X.shape} and {M.shape}")
    if not np.all(np.isfinite(M)):
        raise ConfigError(name, "contains NaN or infinite values")
    return X, M


ARM_FEATURE_NAMES = ("log_k", "fusion_weight", "variant_bm25", "variant_dense",
                     "variant_hybrid", "variant_graph", "norm_minmax", "norm_zscore", "norm_rrf",
                     "mmr_lambda", "rerank", "log_rerank_depth", "abstain_prompt")


def arm_features(configs: Sequence[RAGConfig]) -> np.ndarray:
    """(K, len(ARM_FEATURE_NAMES)) descriptors of the arms' configs for the pooled router, so
    trees can split on "small k" or "dense" across arms (k and rerank depth as log)."""
    rows = []
    for c in configs:
        rows.append([np.log(c.k), c.fusion_weight,
                     *(float(c.variant == v) for v in ("bm25", "dense", "hybrid", "graph")),
                     *(float(c.normalisation == n) for n in ("minmax", "zscore", "rrf")),
                     c.mmr_lambda, float(c.rerank != "none"),
                     np.log(c.rerank_depth) if c.rerank != "none" else 0.0,
                     float(c.prompt_id.endswith("_abstain"))])
    return np.asarray(rows, dtype=np.float64)


def _pooled(X: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """(n·K, d + K + m): every query's features once per arm, followed by the arm's one-hot
    and its descriptors `arms` (K, m); row i·K + j is (query i, arm j), matching
    `R.reshape(-1)`."""
    n, k = X.shape[0], arms.shape[0]
    return np.hstack([np.repeat(X, k, axis=0), np.tile(np.eye(k), (n, 1)),
                      np.tile(arms, (n, 1))])


class SupervisedRouter:
    """Predicts each arm's per-query reward from features; chooses the argmax (module doc)."""

    margin: float = 0.0
    static_arm: int | None = None
    """Class defaults (documented in `__init__`), so a router pickled before they existed
    still decides as it did: plain argmax."""

    def __init__(self, params: RouterParams = RouterParams(), seed: int = 0):
        self.params = params
        self.seed = seed
        self.models: list = []
        self._k = 0
        self._arms = np.zeros((0, 0))
        self.arm_mean = np.zeros(0)
        self.arm_tokens = np.zeros(0)
        self.token_price = 0.0
        """Reward units per token subtracted from an arm's predicted reward (0 = none)."""
        self.margin = 0.0
        """Keep `static_arm` unless the pick's (priced) predicted gain over it exceeds this."""
        self.static_arm: int | None = None
        """The arm kept when no gain clears `margin` (None: plain argmax)."""

    @property
    def n_arms(self) -> int:
        return self._k

    def fit(self, X: np.ndarray, R: np.ndarray, T: np.ndarray | None = None,
            arms: np.ndarray | None = None) -> SupervisedRouter:
        """Fit the regressors on features `X` (n, d) and rewards `R` (n, K); `T` (n, K)
        tokens give each arm's mean tokens for the cost term (zeros without); `arms` (K, m):
        arm descriptors the pooled model also sees (`arm_features`; none without)."""
        from sklearn.ensemble import HistGradientBoostingRegressor

        X, R = _check(X, R, "R")
        p = self.params
        self.arm_mean = R.mean(axis=0)
        self.arm_tokens = (np.zeros(R.shape[1]) if T is None
                           else np.asarray(T, dtype=np.float64).mean(axis=0))
        def model():
            return HistGradientBoostingRegressor(
                max_iter=p.max_iter, learning_rate=p.learning_rate,
                max_leaf_nodes=p.max_leaf_nodes, min_samples_leaf=p.min_samples_leaf,
                l2_regularization=p.l2_regularization, early_stopping=False,
                random_state=self.seed)

        self._k = R.shape[1]
        self._arms = (np.zeros((self._k, 0)) if arms is None
                      else np.asarray(arms, dtype=np.float64))
        if p.pooled:
            self.models = [model().fit(_pooled(X, self._arms), R.reshape(-1))]
        else:
            self.models = [model().fit(X, R[:, j]) for j in range(self._k)]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted per-query reward of every arm, (n, K) [reward units]."""
        if not self.models:
            raise ConfigError("router", "is not fitted")
        X = np.asarray(X, dtype=np.float64)
        if self.params.pooled:
            raw = self.models[0].predict(_pooled(X, self._arms)).reshape(X.shape[0], self._k)
        else:
            raw = np.column_stack([m.predict(X) for m in self.models])
        s = self.params.shrink
        return (1.0 - s) * self.arm_mean[None, :] + s * raw

    def choose(self, X: np.ndarray, token_price: float | None = None) -> np.ndarray:
        """The chosen arm per query (n ints): argmax of predicted reward − price × the arm's
        mean tokens (`token_price` None: the fitted `self.token_price`), or `static_arm`
        where that argmax beats it by no more than `margin` (`decide`)."""
        price = self.token_price if token_price is None else token_price
        return decide(self.predict(X), price, self.arm_tokens, self.margin, self.static_arm)

    def fit_token_price(self, X: np.ndarray | None, T: np.ndarray, budget: float,
                        iters: int = 60, *, scores: np.ndarray | None = None) -> float:
        """Set (and return) the smallest token price whose choices on (`X`, `T`) spend at most
        `budget` mean tokens (0 when the unpriced choices already do). `scores`: (n, K)
        predictions to decide with instead of `self.predict(X)` (`X` is then unused), e.g.
        the out-of-fold ones of `Selection.oof`: on the rows the router was fitted on, its
        own predictions are better than on new queries and the price comes out too low (the
        router then overspends on new queries). A price that sends
        every query to its cheapest arm bounds the search; if no price up to it meets the
        budget, that bound is kept.

        Spend need not fall monotonically as the price rises: an arm cheaper on average can
        cost more on these queries than the arm it replaces, and with a switching margin the
        static arm alone may spend the budget exactly. So the price is first scanned on a
        geometric grid (`PRICE_SCAN` points up to the bound), and bisection (`iters`
        halvings) runs only between the first feasible grid price and the one below it."""
        T = np.asarray(T, dtype=np.float64)
        pred = self.predict(X) if scores is None else np.asarray(scores, dtype=np.float64)
        if pred.shape != T.shape:
            raise ConfigError("X" if scores is None else "scores",
                              f"predictions of shape {pred.shape} for tokens of shape {T.shape}")
        def spend(price: float) -> float:
            return float(pick(T, decide(pred, price, self.arm_tokens, self.margin,
                                        self.static_arm)).mean())

        if spend(0.0) <= budget:
            self.token_price = 0.0
            return 0.0
        steps = np.diff(np.unique(self.arm_tokens))
        hi = (pred.max() - pred.min() + 1.0) / (steps.min() if steps.size else 1.0)
        grid = np.geomspace(hi * 1e-9, hi, PRICE_SCAN)
        first = next((i for i, g in enumerate(grid) if spend(g) <= budget), None)
        if first is not None:
            lo, hi = (0.0 if first == 0 else float(grid[first - 1])), float(grid[first])
            for _ in range(iters):
                mid = 0.5 * (lo + hi)
                lo, hi = (lo, mid) if spend(mid) <= budget else (mid, hi)
        self.token_price = hi
        return hi


def decide(pred: np.ndarray, price: float, arm_tokens: np.ndarray, margin: float = 0.0,
           static_arm: int | None = None) -> np.ndarray:
    """Per row of predicted rewards `pred` (n, K): the argmax of `pred` − `price` × tokens,
    unless `static_arm` is given and that argmax's priced score exceeds the static arm's by
    no more than `margin` (then the static arm). Ties go to the lower index."""
    adj = np.asarray(pred, dtype=np.float64) - price * np.asarray(arm_tokens)[None, :]
    best = np.argmax(adj, axis=1)
    if static_arm is None:
        return best
    rows = np.arange(adj.shape[0])
    return np.where(adj[rows, best] - adj[:, static_arm] > margin, best, static_arm)


@dataclass
class Selection:
    """What `select_router` tried: per candidate its params and mean valid reward, and the
    fitted routers in the same order."""

    best: int
    tried: list[dict]
    routers: list[SupervisedRouter] = field(default_factory=list, repr=False)
    oof: np.ndarray | None = field(default=None, repr=False)
    """`select_router_cv`: the chosen parameters' out-of-fold predictions (n, K) of every
    fitting row, in the order given (None from `select_router`, or a pickle before it)."""


def select_router(X_train: np.ndarray, R_train: np.ndarray, X_valid: np.ndarray,
                  R_valid: np.ndarray, T_train: np.ndarray | None = None,
                  grid: Sequence[RouterParams] = PARAM_GRID, seed: int = 0,
                  arms: np.ndarray | None = None
                  ) -> tuple[SupervisedRouter, Selection]:
    """Fit a router per `grid` entry on train and keep the one whose choices score the highest
    mean realised reward on valid (first on ties). Returns (router, what was tried)."""
    _check(X_valid, R_valid, "R_valid")
    tried, routers = [], []
    for params in grid:
        r = SupervisedRouter(params, seed).fit(X_train, R_train, T_train, arms)
        value = float(pick(R_valid, r.choose(X_valid)).mean())
        tried.append({**asdict(params), "valid_reward": value})
        routers.append(r)
    best = int(np.argmax([t["valid_reward"] for t in tried]))
    return routers[best], Selection(best, tried, routers)


MARGINS: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, float("inf"))
"""Switching margins a caller may have `select_router_cv` choose among, in reward units
(inf = always the static arm)."""

CV_MARGINS: tuple[float, ...] = (0.0,)
"""The margins `select_router_cv` tries by default: 0 alone (plain argmax, ties to the static
arm)."""

CV_FOLDS = 4
"""Folds of `select_router_cv`'s cross-validation."""


def select_router_cv(X: np.ndarray, R: np.ndarray, T: np.ndarray | None = None,
                     groups: Sequence[str] | None = None,
                     grid: Sequence[RouterParams] = PARAM_GRID,
                     margins: Sequence[float] = CV_MARGINS, folds: int = CV_FOLDS,
                     seed: int = 0,
                     arms: np.ndarray | None = None,
                     log: Callable[[str], None] | None = None
                     ) -> tuple[SupervisedRouter, Selection]:
    """Choose the router's hyper-parameters and switching margin by grouped `folds`-fold
    cross-validation over all rows (`X`, `R`, `T`: train ∪ valid), then refit on every row.

    Per `grid` entry, out-of-fold predictions of every arm (`out_of_fold_scores`: no row is
    predicted by a model that fitted it or its `groups` label, e.g. its conversation) are
    decided with each margin against the best static arm of all rows (`decide`); the pair
    with the highest mean realised reward wins (first on ties, so the smaller margin). The
    returned router has `static_arm` and `margin` set; `Selection.tried` lists every pair's
    out-of-fold reward and `Selection.oof` holds the winner's out-of-fold predictions.
    `groups` None: every row its own group. `log`: a line per `grid` entry cross-validated."""
    X, R = _check(X, R, "R")
    if not margins or any(not m >= 0 for m in margins):
        raise ConfigError("margins", f"must be a non-empty list of numbers >= 0, got "
                                     f"{list(margins)}")
    groups = [str(i) for i in range(len(X))] if groups is None else list(groups)
    if len(groups) != len(X):
        raise ConfigError("groups", f"{len(groups)} labels for {len(X)} rows")
    static = best_static(R)
    zero = np.zeros(R.shape[1])
    tried, chosen, best_v, best_oof = [], 0, -np.inf, None
    t0 = time.perf_counter()
    for i, params in enumerate(grid, 1):
        oof = out_of_fold_scores(params, X, R, T, arms, groups, folds, seed)
        for m in margins:
            v = float(pick(R, decide(oof, 0.0, zero, m, static)).mean())
            tried.append({**asdict(params), "margin": m, "cv_reward": v})
            if v > best_v + 1e-12:
                chosen, best_v, best_oof = len(tried) - 1, v, oof
        if log:
            log(f"  router: {i}/{len(grid)} parameter sets cross-validated, best CV reward "
                f"so far {best_v:.4f} ({time.perf_counter() - t0:.0f} s)")
    router = SupervisedRouter(grid[chosen // len(margins)], seed).fit(X, R, T, arms)
    router.static_arm, router.margin = static, tried[chosen]["margin"]
    return router, Selection(chosen, tried, [router], best_oof)


def out_of_fold_scores(params: RouterParams, X: np.ndarray, R: np.ndarray,
                       T: np.ndarray | None, arms: np.ndarray | None, groups: Sequence[str],
                       k: int = 5, seed: int = 0) -> np.ndarray:
    """(n, K) predicted rewards of every arm for every row of `X`, each from a router with
    `params` fitted on the other folds (`group_folds`)."""
    X, R = _check(X, R, "R")
    folds = group_folds(groups, k, seed)
    out = np.zeros_like(R)
    for f in range(k):
        held = folds == f
        r = SupervisedRouter(params, seed).fit(X[~held], R[~held],
                                               None if T is None else np.asarray(T)[~held],
                                               arms)
        out[held] = r.predict(X[held])
    return out


ROUTER_FEATURE_NAMES = ("router_pred_pick", "router_pred_static", "router_gain_over_static",
                        "router_margin", "router_log_tokens",
                        *(f"router_pick_{n}" for n in ARM_FEATURE_NAMES))


def router_features(scores: np.ndarray, token_price: float, arm_tokens: np.ndarray,
                    static_arm: int, arms: np.ndarray, margin: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The router's pick per row (argmax of `scores` − price × the arm's tokens; with a
    `margin`, `static_arm` unless the argmax beats it by more: `decide`) and the features
    `ROUTER_FEATURE_NAMES`: predicted reward of the pick and of `static_arm` (the best static
    arm), their gap, the margin of the pick over the runner-up (price-adjusted), log(1 + the
    pick's mean tokens) and the pick's descriptors (`arm_features` rows `arms`)."""
    S = np.asarray(scores, dtype=np.float64)
    adj = S - token_price * np.asarray(arm_tokens, dtype=np.float64)[None, :]
    pick = decide(S, token_price, arm_tokens, margin or 0.0,
                  None if margin is None else static_arm)
    rows = np.arange(len(S))
    top2 = np.sort(adj, axis=1)[:, -2] if S.shape[1] > 1 else adj[:, 0]
    F = np.column_stack([S[rows, pick], S[:, static_arm], S[rows, pick] - S[:, static_arm],
                         adj[rows, pick] - top2, np.log1p(np.asarray(arm_tokens)[pick]),
                         np.asarray(arms)[pick]])
    return pick, F


def router_view(router: SupervisedRouter, price: float, static_arm: int,
                arm_desc: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A residual policy's base pick per row (`router` at token `price`, with its switching
    margin over its own static arm when it has one, else plain argmax with `static_arm` as
    the reference arm of the features) and the router's view of the row (`router_features`),
    from the router's predicted rewards `scores` (n, K). `arm_desc`: `arm_features` of its
    arms."""
    static = router.static_arm if router.static_arm is not None else static_arm
    return router_features(scores, price, router.arm_tokens, static, arm_desc,
                           router.margin if router.static_arm is not None else None)


STACK_FOLDS = 5
"""Folds of the fitted queries' out-of-fold router view (`stacked`)."""


def stacked(router: SupervisedRouter, price: float, static_arm: int,
            X: dict[str, np.ndarray], M: dict[str, dict[str, np.ndarray]],
            groups: dict[str, list[str]], configs: Sequence[RAGConfig], seed: int,
            oof: np.ndarray | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The residual PPO policy's observations and base picks per role (X[role]: its query
    features, M[role]: its R and T over the arms `configs`): the query features followed by
    the router's view of the query (`router_view`). `groups` names the roles the router was
    fitted on, in its fit order, with each query's group (MTRAG: its conversation): on those
    roles the scores are out of fold (`out_of_fold_scores` over them, folds grouped, the
    router's chosen hyper-parameters), so PPO's training and its model selection see the
    router as good as it is on new queries; on every other role they are the fitted router's
    own. `oof`: those out-of-fold scores already computed over the fitted roles in order
    (`Selection.oof` of the router's `select_router_cv`, the scores its price was fitted on),
    else `STACK_FOLDS` folds here."""
    arm_desc = arm_features(list(configs))
    fitted = list(groups)
    n_fitted = sum(len(X[r]) for r in fitted)
    if oof is None:
        oof = out_of_fold_scores(
            router.params, np.vstack([X[r] for r in fitted]),
            np.vstack([M[r]["R"] for r in fitted]), np.vstack([M[r]["T"] for r in fitted]),
            arm_desc, [g for r in fitted for g in groups[r]], STACK_FOLDS, seed)
    elif oof.shape != (n_fitted, router.n_arms):
        raise ConfigError("oof", f"shape {oof.shape}: expected ({n_fitted}, "
                                 f"{router.n_arms}) for the roles {fitted}")
    scores, at = {}, 0
    for r in fitted:
        scores[r], at = oof[at:at + len(X[r])], at + len(X[r])
    for role in X:
        if role not in fitted:
            scores[role] = router.predict(X[role])
    Xo, arms_ = {}, {}
    for role, S in scores.items():
        arms_[role], F = router_view(router, price, static_arm, arm_desc, S)
        Xo[role] = np.hstack([X[role], F])
    return Xo, arms_


class SegmentLookup:
    """The best arm per segment label, learnt from a reward matrix."""

    def __init__(self):
        self.table: dict[str, int] = {}
        self.fallback = 0

    def fit(self, R: np.ndarray, labels: Sequence) -> SegmentLookup:
        """Per label, the arm with the highest mean reward over its queries; `fallback` = the
        best static arm of `R` (for labels not seen here)."""
        self.table = segment_choice(R, labels)
        self.fallback = best_static(R)
        return self

    def choose(self, labels: Sequence) -> np.ndarray:
        return np.array([self.table.get(str(s), self.fallback) for s in labels],
                        dtype=np.int64)
