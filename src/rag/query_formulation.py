"""The retrieval query of a conversational turn: the question plus some of its history.

`formulate_query(question, history, formulation)` -> the text the retrievers (and the reranker
and MMR) see; the generator still answers `question` itself. `history` is `Example.history`:
the earlier turns, oldest first, each `{"role": ..., "text": ...}` (MTRAG's roles are `user`
and `agent`; a turn without a role counts as a user turn).

    last_turn      the question alone (what `RAGConfig.query_formulation = None` means)
    last_two_user  the previous user turn, then the question
    all_user       every user turn, oldest first, then the question

Turns are joined with a newline. An LLM "rewrite" formulation (a model turns the conversation
into a stand-alone question) is out of scope here: it needs a generator call per query, and so
a cost model, before the tuner can weigh it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

FORMULATIONS = ("last_turn", "last_two_user", "all_user")


def user_turns(history: Sequence[Mapping[str, str]]) -> list[str]:
    """The non-empty texts of the user turns of `history`, oldest first."""
    return [str(t.get("text") or "").strip() for t in history
            if str(t.get("role", "user")).lower() == "user" and str(t.get("text") or "").strip()]


def formulate_query(question: str, history: Sequence[Mapping[str, str]] | None,
                    formulation: str | None, max_chars: int | None = None) -> str:
    """The retrieval query for `question` after `history` (see the module doc). None or
    "last_turn", or an empty history, give `question` unchanged. `max_chars`: the oldest
    turns are left out until the query fits (the question itself always stays). ValueError on
    an unknown formulation."""
    if formulation not in (None, *FORMULATIONS):
        raise ValueError(f"query formulation must be one of {', '.join(FORMULATIONS)}, "
                         f"got {formulation!r}")
    if not history or formulation in (None, "last_turn"):
        return question
    users = user_turns(history)
    earlier = users[-1:] if formulation == "last_two_user" else users
    query = "\n".join([*earlier, question])
    while max_chars is not None and earlier and len(query) > max_chars:
        earlier = earlier[1:]
        query = "\n".join([*earlier, question])
    return query
