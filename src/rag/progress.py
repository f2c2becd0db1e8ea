"""Progress of long work (index builds, embedding, evaluation, tuning, training): the one way
every command shows what it is doing, how far it got, and an estimate of the rest.

Library code reports; the entry point decides whether it is shown. Outside `reporting()`
every call here is a no-op, so a library caller, a test or a Serve replica stays silent;
the `ragpilot` CLI runs each command inside it, on stderr (but the demo, whose live display
shows its own stages).

    with progress.reporting():                     # the entry point
        ...
    with progress.stage("embed passages", total=len(texts), unit="passages") as st:
        for batch in batches:
            ...
            st.advance(len(batch))
    progress.say("tune: 11 valid / 10 test questions")   # a one-line stage note
    progress.advance(1, "query-evaluations")       # deep inside: the open stage of that unit

On a terminal (the stream's `isatty()`) a stage with a total is a live tqdm bar. Anywhere else
(a log file, a pipe, CI) a stage is lines, `[HH:MM:SS]` UTC first:

    [12:00:01] embed passages: start (5183 passages)
    [12:00:11] embed passages: 1024/5183 passages (20%), 10 s, ~41 s left
    [12:00:53] embed passages: done, 5183/5183 passages in 52.0 s

at most one count line every `INTERVAL_S` seconds within a stage. The estimate is the
stage's mean rate so far applied to what is left; none is given before the first count.
While the innermost open stage goes INTERVAL_S without a line (one slow item, or work that
cannot be counted: a model load, an index build), a background ticker writes its line anyway
(`build index graph (5183 passages): 20 s so far`), so a log is never silent for much longer
than INTERVAL_S inside a stage.
A stage left by an exception says `failed after N s` and re-raises. Stages nest (an index build
inside an evaluation inside a search); lines are written whole under one lock, so threads may
report at once.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import IO, Any

INTERVAL_S = 10.0
"""Seconds between count lines of one stage in a non-interactive log."""
TICK_S = 1.0
"""How often the ticker looks at the innermost open stage."""

_lock = threading.Lock()
_state: dict[str, Any] = {"on": 0, "stream": None}
_open: list[Stage] = []
"""Stages open now (that tick), innermost last; the ticker runs while it is not empty."""
_ticker: dict[str, threading.Thread | None] = {"thread": None}


def _tick_loop() -> None:
    """Tick the innermost open stage every TICK_S; ends when no stage is open."""
    while True:
        time.sleep(TICK_S)
        with _lock:
            if not _open:
                _ticker["thread"] = None
                return
            st = _open[-1]
        with suppress(OSError, ValueError):  # the stream went away (closed, a broken pipe)
            st.tick()


def _opened(st: Stage) -> None:
    with _lock:
        _open.append(st)
        if _ticker["thread"] is None:
            t = threading.Thread(target=_tick_loop, name="rag.progress", daemon=True)
            _ticker["thread"] = t
            t.start()


def _closed(st: Stage) -> None:
    with _lock:
        if st in _open:
            _open.remove(st)


@contextmanager
def reporting(stream: IO[str] | None = None) -> Iterator[None]:
    """Show progress on `stream` (default: sys.stderr as it is when a line is written) while
    inside; nests (the outer stream is restored on exit)."""
    with _lock:
        saved = dict(_state)
        _state.update(on=saved["on"] + 1, stream=stream)
    try:
        yield
    finally:
        with _lock:
            _state.update(saved)


def active() -> bool:
    """Whether progress is shown now (inside `reporting()`)."""
    return _state["on"] > 0


def _stream() -> IO[str]:
    return _state["stream"] or sys.stderr


def _interactive() -> bool:
    isatty = getattr(_stream(), "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _write(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    with _lock:
        s = _stream()
        s.write(f"[{stamp}] {text}\n")
        s.flush()


def say(text: str) -> None:
    """One line (a stage that needs no count: what is starting, or a result), when shown."""
    if active():
        _write(text)


def _secs(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


class Stage:
    """One stage of long work: `advance(n)` / `update(done)` its count; a context manager that
    writes its start and end lines. Inactive (outside `reporting()` when opened): every method
    is a no-op."""

    def __init__(self, what: str, total: int | None = None, unit: str = "",
                 clock=time.monotonic):
        """`clock`: seconds (monotonic); a stage on another clock (a test's) does not tick."""
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.on = active()
        self._clock = clock
        self._t0 = self._last = clock()
        self._bar = None
        self._mu = threading.Lock()  # the caller's update and the ticker's tick
        self._ended = False

    def _count(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.total is None:
            return f"{self.done}{unit}"
        return f"{self.done}/{self.total}{unit}"

    def __enter__(self) -> Stage:
        if not self.on:
            return self
        self._t0 = self._last = self._clock()
        if self.total is not None and _interactive():
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.what, unit=f" {self.unit}".rstrip()
                             or "it", file=_stream(), leave=True, dynamic_ncols=True)
        else:
            unit = f" {self.unit}" if self.unit else ""
            _write(f"{self.what}: start" + (f" ({self.total}{unit})"
                                             if self.total is not None else ""))
        if self._clock is time.monotonic:
            _opened(self)
        return self

    def advance(self, n: int = 1) -> None:
        """`n` more items done."""
        self.update(self.done + n)

    def update(self, done: int) -> None:
        """`done` items done so far; a count line when INTERVAL_S passed since the last."""
        self.done = int(done)
        if not self.on:
            return
        if self._bar is not None:
            self._bar.n = min(self.done, self.total or self.done)
            self._bar.refresh()
            return
        if self.total is not None and self.done >= self.total:
            return  # all done: the end line follows
        self._line(force=False)

    def tick(self) -> None:
        """The ticker's call: the stage's line when INTERVAL_S passed without one (a bar is
        redrawn, so its clock moves)."""
        if not self.on:
            return
        if self._bar is not None:
            self._bar.refresh()
            return
        self._line(force=True)

    def _line(self, force: bool) -> None:
        """A count line (`force`: the ticker's, also for an uncounted stage) when INTERVAL_S
        passed since the stage's last line."""
        with self._mu:
            now = self._clock()
            if self._ended or now - self._last < INTERVAL_S or (
                    not force and self.total is None and not self.done):
                return
            self._last = now
            if self.total is None and not self.done:
                _write(f"{self.what}: {_secs(now - self._t0)} so far")
            else:
                _write(f"{self.what}: {self._count()}{self._fraction()}, "
                       f"{_secs(now - self._t0)}{self._eta(now)}")

    def _fraction(self) -> str:
        if not self.total:
            return ""
        return f" ({100 * min(self.done, self.total) / self.total:.0f}%)"

    def _eta(self, now: float) -> str:
        """', ~N s left' from the mean rate so far; '' without a total or a first count."""
        if not self.total or self.done <= 0:
            return ""
        left = max(self.total - self.done, 0) * (now - self._t0) / self.done
        return f", ~{_secs(left)} left"

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.on:
            return
        _closed(self)
        with self._mu:
            self._ended = True
        elapsed = self._clock() - self._t0
        if self._bar is not None:
            self._bar.close()
        if exc_type is not None:
            _write(f"{self.what}: failed after {elapsed:.1f} s")
        elif self._bar is None:
            counted = f", {self._count()}" if self.total is not None or self.done else ""
            _write(f"{self.what}: done{counted} in {elapsed:.1f} s")


def advance(n: int = 1, unit: str = "") -> None:
    """`n` more items of `unit` done, counted by the innermost open stage that counts `unit`:
    how code deep inside a stage its caller opened reports its items (the tuner's evaluator
    adds each query-evaluation to `tune: search`, so a trial shows its progress before it
    ends). A no-op when progress is off or no open stage counts `unit`."""
    if not active():
        return
    with _lock:
        st = next((x for x in reversed(_open) if x.unit == unit and x.total is not None), None)
    if st is not None:
        st.advance(n)


def stage(what: str, total: int | None = None, unit: str = "") -> Stage:
    """A `Stage` named `what` (what the work is: 'build index dense-flat'), of `total` items
    counted in `unit` (None: no count, start and end lines only)."""
    return Stage(what, total, unit)
