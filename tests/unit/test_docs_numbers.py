"""Every measured number in README.md, docs/ and runbooks/ is in a committed results file.

The brief's rule: a number in README or docs comes from a committed results file and the command
beside it. This checks the half a machine can check: each decimal with two or more places in
the prose (0.229, +0.055, 12.6) must equal, at the precision written, some number in
bench/results/ (its committed JSON and markdown, not `--quick` output; sign ignored, since prose writes gains as
−0.004 and tables as -0.004). A number found nowhere cannot have come from a results file; a
number found may still match by coincidence, so this catches stale and invented figures, not
every wrong one. The few numbers that are not measurements are listed with why."""

from __future__ import annotations

import bisect
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PROSE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "runbooks").glob("*.md"))]
DECIMAL = re.compile(r"(?<![\w.])[-+−]?(\d+\.\d{2,})(?![\d])")
NOT_MEASURED = {
    ("operations.md", "0.9999"): "the same threshold, checked before a vector is used",
    ("serving.md", "4.32"): "the schemathesis version (4.32.5) the fuzzing ran with",
}


def checked_text(page: Path) -> str:
    """The page's text with its "Retired studies" section (docs/results.md) blanked, line
    numbers kept: that section cites deleted studies, whose numbers and paths `git log --
    bench/NAME.py` holds, not the tree."""
    lines = page.read_text().splitlines()
    out, retired = [], False
    for line in lines:
        if line.startswith("## "):
            retired = line.strip() == "## Retired studies"
        out.append("" if retired else line)
    return "\n".join(out) + "\n"


@cache
def _results_values() -> list[float]:
    vals = set()
    for f in RESULTS.rglob("*"):
        if f.suffix in (".json", ".md") and f.is_file() and ".quick." not in f.name:
            for m in re.finditer(r"\d+\.\d+(?:e[-+]?\d+)?", f.read_text(errors="ignore")):
                vals.add(float(m.group()))
    return sorted(vals)


def in_results(token: str, values: list[float]) -> bool:
    """Whether some value of the sorted `values` rounds to `token` at its written precision."""
    places = len(token.split(".")[1])
    target = round(float(token), places)
    lo = bisect.bisect_left(values, target - 10 ** -places)
    hi = bisect.bisect_right(values, target + 10 ** -places)
    return any(abs(round(v, places) - target) < 10 ** -(places + 3) for v in values[lo:hi])


def unmatched(text: str, values: list[float], page: str) -> list[tuple[int, str]]:
    return [(i, m.group(1)) for i, line in enumerate(text.splitlines(), 1)
            for m in DECIMAL.finditer(line)
            if (page, m.group(1)) not in NOT_MEASURED and not in_results(m.group(1), values)]


@pytest.mark.parametrize("page", PROSE, ids=lambda p: str(p.relative_to(REPO)))
def test_every_measured_number_is_in_a_results_file(page):
    if not _results_values():
        pytest.skip("no bench/results here")
    missing = unmatched(checked_text(page), _results_values(), page.name)
    assert not missing, f"{page.name}: numbers in no bench/results file (line, number): {missing}"


def test_the_allowlist_is_still_needed():
    values = _results_values()
    for (page, token), why in NOT_MEASURED.items():
        text = next(p for p in PROSE if p.name == page).read_text()
        assert token in text and not in_results(token, values), (page, token, why)


def test_the_check_catches_an_invented_number():
    values = sorted([0.229, 12.61, 0.0551])
    assert unmatched("captured 0.229 [0.146, 0.307]; p95 12.6 ms; +0.055", values, "x.md") == \
        [(1, "0.146"), (1, "0.307")]
    assert in_results("12.6", values) and not in_results("12.60", values)


def test_only_the_retired_studies_section_is_blanked(tmp_path):
    page = tmp_path / "results.md"
    page.write_text("## Kept\n0.123\n## Retired studies\n- x: 0.456\n## After\n0.789\n")
    assert checked_text(page).splitlines() == ["## Kept", "0.123", "", "", "## After", "0.789"]
