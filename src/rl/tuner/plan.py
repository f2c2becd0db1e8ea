"""What a search runs: one `SearchPlan` (method, budget, seed, first trial) that every driver
takes: the executors `rl.tuner.ask_tell.run_search` and `rl.tuner.tune_search.tune_search`, and
`rl.tuner.run.search` / `run_tuning` (which also run PPO). It imports nothing heavy, so an entry
point can build a plan before Ray or the searchers load."""

from __future__ import annotations

from dataclasses import dataclass

from rag.config import RAGConfig

DEFAULT_SEARCHER = "local-asha"
"""The project's searcher: local search proposes one-head moves of the best config
(`rl.tuner.searchers.LocalSearch`), ASHA spends full-split evaluations only on configs that rank in the
top third of their rung."""


@dataclass(frozen=True)
class SearchPlan:
    """What a search runs, whichever executor or driver runs it (module docstring).

    `method`: a searcher of `rl.tuner.searchers.SEARCHERS` (the executors), or "ppo" (`rl.tuner.run`
    only); `budget`: query-evaluations (one config scored on one query; an int >= 1, or None
    where the caller fills in a default: `rl.tuner.run.run_tuning`); `seed`: the searcher's and
    scheduler's (and PPO's); `start`: a RAGConfig evaluated as the first trial (e.g. the one in
    production; grid and ppo ignore it). Checked where it runs: ConfigError naming `method` or
    `budget` (`rl.tuner.ask_tell.check_search`, `rl.tuner.run.check`)."""

    method: str = DEFAULT_SEARCHER
    budget: int | None = None
    seed: int = 0
    start: RAGConfig | None = None
