"""Evidence for a rollout: an evidence file -> the EvaluationReports of the rollout's stage.

An evidence file is EvaluationReport JSON (`rl.promotion.evaluators`; one object, a list, or
JSONL of them) or an interaction export (`ragpilot export-interactions`, JSONL rows with a
`variant_id`). Rows are turned into one report of the stage's kind: shadow (paired mirrored
rows) or canary (split rows); at stage candidate rows are refused (the offline report is a
replay of them, `ragpilot rollout replay`, judged per metric). A row's reward (and
`scores[reward_key]`) loses `pii_penalty` (default `rl.kernel.reward.PII_LEAK_WEIGHT`) per PII
leak of its answer (`scores.pii_leaks`), as the serving bandit learns it. Shadow/canary use
only rows newer than the state's `row_cursor` (the newest row already counted), so a
cumulative export can be passed again safely (in shadow, a served row whose mirrored answer is
not logged yet waits for it, `MIRROR_WAIT_S`, and a row whose reference-free signals are not
stored yet waits for them, `SIGNALS_WAIT_S`); a report file's report is counted once per
rollout (its fingerprint is kept in the state). `reports_from_store` reads the Serve app's own
store instead of a file.

Nothing here prints. Errors are ConfigError with the field `evidence` (file missing, not JSON
at file:line, neither reports nor rows) or `pii_penalty` (negative weight).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.textio import NotUtf8, decode_text


@dataclass
class Evidence:
    """What an evidence file added: `reports` to observe, in order, and `notes` saying why a
    file added nothing (e.g. no rows newer than the last batch counted)."""

    reports: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __iadd__(self, other: Evidence) -> Evidence:
        self.reports += other.reports
        self.notes += other.notes
        return self


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a `.jsonl` file (one per non-empty line) or of a JSON file (one
    object or a list of them)."""
    return [r for _, r in read_located(path)]


def read_located(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """`read_records` with where each record is (`file:line` of a JSONL file, `file record
    i` of a JSON list), for error messages."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("evidence", f"file {path} does not exist")
    try:
        text = decode_text(path.read_bytes())
    except NotUtf8 as exc:
        raise ConfigError("evidence", f"{path}:{exc.line}: {exc}") from None
    try:
        if path.suffix == ".jsonl":
            out = []
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ConfigError("evidence", f"{path}:{i}: not JSON ({exc.msg})"
                                          ) from None
                    if not isinstance(rec, dict):
                        raise ConfigError("evidence", f"{path}:{i}: expected a JSON object")
                    out.append((f"{path}:{i}", rec))
            return out
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("evidence", f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    records = data if isinstance(data, list) else [data]
    if not all(isinstance(r, dict) for r in records):
        raise ConfigError("evidence", f"{path}: expected JSON objects")
    return [(f"{path} record {i}", r) for i, r in enumerate(records, 1)]  # 1-based, as lines


def check_rows(located: list[tuple[str, dict[str, Any]]]) -> None:
    """Interaction rows (`InteractionStore.export_jsonl`) hold numbers where the evaluators
    read numbers: `reward` null or in [0, 1], `propensity` in (0, 1], `ts`, `tokens_in`,
    `tokens_out` numbers, `latency_ms` and `scores` objects of numbers (NaN: not scored) or
    null. A bad one is a ConfigError naming the file, line and key (it was a ValueError deep
    inside)."""
    def number(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    def bad(where: str, r: dict[str, Any], key: str, what: str) -> ConfigError:
        return ConfigError("evidence", f"{where}: {key} must be {what}, got {r.get(key)!r}")

    for where, r in located:
        if not isinstance(r.get("variant_id"), str) or not r["variant_id"]:
            raise bad(where, r, "variant_id", "a variant id (a string)")
        if r.get("reward") is not None and not (number(r["reward"]) and 0 <= r["reward"] <= 1):
            raise bad(where, r, "reward", "null or a number in [0, 1]")
        if r.get("propensity") is not None and not (
                number(r["propensity"]) and 0 < r["propensity"] <= 1):
            raise bad(where, r, "propensity", "a number in (0, 1]")
        for key in ("ts", "tokens_in", "tokens_out"):
            if r.get(key) is not None and not number(r[key]):
                raise bad(where, r, key, "a number")
        for key in ("latency_ms", "scores"):
            v = r.get(key)
            if v is not None and not (isinstance(v, dict) and all(  # NaN: not scored
                    x is None or (not isinstance(x, bool) and isinstance(x, (int, float)))
                    for x in v.values())):
                raise bad(where, r, key, "an object of numbers")


def pii_leaks_of(scores: str | dict | None) -> float:
    """`pii_leaks` of a stored `scores` value (JSON text or dict); 0 when absent or invalid."""
    if isinstance(scores, str):
        try:
            scores = json.loads(scores)
        except ValueError:
            return 0.0
    v = scores.get("pii_leaks") if isinstance(scores, dict) else None
    try:
        x = float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def penalize_pii(rows: list[dict[str, Any]], reward_key: str | None = None,
                 weight: float | None = None) -> list[dict[str, Any]]:
    """Rows whose `reward` (and `scores[reward_key]`) carry the PII-leak penalty
    (`rl.kernel.reward.feedback_reward`, `weight` per leak, default PII_LEAK_WEIGHT); rows
    without leaks are returned as they are (the input is not modified)."""
    from rl.kernel.reward import PII_LEAK_WEIGHT, feedback_reward

    w = PII_LEAK_WEIGHT if weight is None else float(weight)
    if not w >= 0:
        raise ConfigError("pii_penalty", f"must be >= 0, got {weight!r}")
    out = []
    for r in rows:
        leaks = pii_leaks_of(r.get("scores"))
        if leaks > 0 and w > 0:
            r = dict(r)
            if r.get("reward") is not None:
                r["reward"] = feedback_reward(float(r["reward"]), leaks, w)
            sc = r.get("scores")
            if reward_key and isinstance(sc, dict) and sc.get(reward_key) is not None:
                r["scores"] = {**sc, reward_key: feedback_reward(float(sc[reward_key]), leaks,
                                                                 w)}
        out.append(r)
    return out


def report_fingerprint(rec: dict[str, Any]) -> str:
    """sha256 of a report's canonical JSON: the same report submitted again has the same one."""
    return hashlib.sha256(json.dumps(rec, sort_keys=True, default=str).encode()).hexdigest()


def reports_from_file(path: str | Path, sm: Any, reward_key: str | None = None,
                      thresholds: Any = None, pii_penalty: float | None = None) -> Evidence:
    """The evidence of one file for the rollout `sm` (a PromotionStateMachine) at its current
    stage. A report already counted in this rollout (`report_fingerprint` in
    `state.counted`, which `rl.promotion.service.advance` keeps) is skipped with a note, so
    resubmitting a file adds nothing. Interaction rows for shadow/canary advance
    `sm.state.row_cursor` (saved by the next `sm.observe`)."""
    from rl.promotion.evaluators import EvaluationReport

    located = read_located(path)
    recs = [r for _, r in located]
    if not recs:
        raise ConfigError("evidence", f"{path} is empty")
    if all("kind" in r and "candidate" in r for r in recs):
        out = Evidence()
        for where, r in located:
            try:
                rep = EvaluationReport.from_dict(r)
            except ConfigError as exc:
                raise ConfigError(exc.field, f"{exc.message} (at {where})") from None
            if report_fingerprint(rep.to_dict()) in sm.state.counted:
                out.notes.append(f"{where}: this report was already counted in rollout "
                                 f"{sm.state.rollout_id}; not counted again")
                continue
            out.reports.append(rep)
        return out
    if not all("variant_id" in r for r in recs):
        raise ConfigError("evidence", f"{path}: neither evaluation reports nor interaction "
                                      "rows (need 'kind'+'candidate' or 'variant_id')")
    return reports_from_rows(located, sm, str(path), reward_key, thresholds, pii_penalty)


def reports_from_store(store_url: str | Path, sm: Any, pii_penalty: float | None = None,
                       open_store: Any = None) -> Evidence:
    """The evidence in the Serve app's own interaction store (`store_url`, what its
    `store_url` setting names) for the rollout `sm`: the store exported once (every row with
    its feedback) and read like an interaction export. `open_store`: the store opener
    (serving.store.open_store; passed in, since `rl` never imports `serving`)."""
    import tempfile

    if open_store is None:
        raise ConfigError("store", "no store opener given")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "interactions.jsonl"
        open_store(str(store_url), create=False).export_jsonl(path)
        located = read_located(path)
    if not located:
        return Evidence(notes=[f"{store_url}: no interactions logged yet; nothing added"])
    return reports_from_rows([(w.replace(str(path), str(store_url)), r) for w, r in located],
                             sm, str(store_url), None, None, pii_penalty)


def reports_from_rows(located: list[tuple[str, dict[str, Any]]], sm: Any, source: str,
                      reward_key: str | None = None, thresholds: Any = None,
                      pii_penalty: float | None = None) -> Evidence:
    """Interaction rows -> one report of the stage's kind (shadow: paired mirrored rows;
    canary: split rows; ConfigError `evidence` at stage candidate, whose offline report is
    the replay of such rows, `rl.promotion.replay`). Shadow/canary use only rows newer than
    `sm.state.row_cursor` and move it to the newest (a row is counted at most once); the
    report's `meta.quality_on` says how many pairs (canary: requests) had their quality
    judged on gold-based scores, on `sig_combined`, or on nothing (`arms_from_rows`)."""
    from rl.promotion.evaluators import CanaryEvaluator, ShadowEvaluator
    from rl.promotion.log_evaluators import arms_from_rows
    from rl.promotion.state_machine import KIND

    check_rows(located)
    cfg, st = sm.config, sm.state
    kind = KIND.get(sm.stage, "canary")
    if kind == "offline":
        raise ConfigError("evidence", f"{source} holds interaction rows; stage candidate takes "
                                      "an offline report with per-metric paired statistics: "
                                      f"`ragpilot rollout replay --log {source} --candidate "
                                      "<config YAML>` writes one from these rows")
    recs = penalize_pii([r for _, r in located], reward_key, pii_penalty)
    fresh = [r for r in recs if float(r.get("ts") or 0.0) > st.row_cursor]
    if not fresh:
        return Evidence(notes=[f"{source}: no interaction rows newer than the last batch "
                               f"counted (ts > {st.row_cursor:.3f}); nothing added"])
    cursor = max(float(r["ts"]) for r in fresh)
    fresh, cursor = _settled_signals(fresh, cursor, cfg.quality_scores)
    if kind == "shadow":
        fresh, cursor = _settled_pairs(fresh, st.stable, cursor)
    ev_cls = ShadowEvaluator if kind == "shadow" else CanaryEvaluator
    ev = ev_cls(thresholds or cfg.thresholds, latency_slo_ms=cfg.slo.latency_ms)
    try:
        stable, cand, quality_on = arms_from_rows(fresh, st.stable, st.candidate, kind,
                                                  reward_key, cfg.quality_scores)
    except ConfigError as exc:  # e.g. no mirrored pair yet: wait for more traffic
        return Evidence(notes=[f"{source}: {len(fresh)} new rows, no evidence yet "
                               f"({exc.message})"])
    st.row_cursor = cursor  # saved by the next observe
    return Evidence([ev.evaluate(stable, cand, source=source, quality_on=quality_on)])


SIGNALS_WAIT_S = 30.0
"""How long a row without any quality score (no gold-based score, no `sig_combined`) waits
for the reference-free signals the Serve app appends after answering, before the evidence goes
past it and counts it under quality `none` (signals skipped when the scoring queue was full
never come)."""


def _settled_signals(rows: list[dict[str, Any]], newest: float, quality_scores: Any
                     ) -> tuple[list[dict[str, Any]], float]:
    """The rows to count now and the new cursor: every row up to just before the oldest
    request still waiting for its signals (no quality score yet, younger than SIGNALS_WAIT_S
    before the newest row; a mirrored answer waits as its served request). The waiting row and
    those after it stay newer than the cursor and are read again next time."""
    from rl.promotion.log_evaluators import QUALITY_SCORES, scored_quality

    keys = tuple(quality_scores or QUALITY_SCORES)
    ts = {r.get("id"): float(r["ts"]) for r in rows}
    waiting = []
    for r in rows:
        t = ts.get(r.get("parent_id"), float(r["ts"])) if r.get("shadow") else float(r["ts"])
        if t > newest - SIGNALS_WAIT_S and scored_quality([r], keys)[1] == "none":
            waiting.append(t)
    if not waiting:
        return rows, newest
    cut = min(waiting) - 1e-6
    return _up_to(rows, cut), cut


MIRROR_WAIT_S = 30.0
"""How long a served stable row waits for its mirrored answer before the shadow evidence goes
past it (a mirror still running when the evidence is read would otherwise be lost)."""


def _settled_pairs(rows: list[dict[str, Any]], stable: str, newest: float
                   ) -> tuple[list[dict[str, Any]], float]:
    """The shadow rows to count now and the new cursor: every served stable row up to just
    before the oldest one still waiting for its mirror (younger than MIRROR_WAIT_S before the
    newest row), with the mirrors of those rows. The waiting row and the rows after it stay
    newer than the cursor and are read again next time; counted rows are not."""
    mirrored = {r.get("parent_id") for r in rows if r.get("shadow")}
    waiting = [float(r["ts"]) for r in rows if not r.get("shadow")
               and r.get("variant_id") == stable and r.get("id") not in mirrored
               and float(r["ts"]) > newest - MIRROR_WAIT_S]
    cut = min(waiting) - 1e-6 if waiting else newest
    return _up_to(rows, cut), cut


def _up_to(rows: list[dict[str, Any]], cut: float) -> list[dict[str, Any]]:
    """The served rows at or before `cut`, with the mirrored answers of those rows."""
    served = {r.get("id") for r in rows if not r.get("shadow") and float(r["ts"]) <= cut}
    return [r for r in rows if (not r.get("shadow") and float(r["ts"]) <= cut)
            or (r.get("shadow") and r.get("parent_id") in served)]
