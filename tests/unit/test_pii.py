"""PII detection, redaction, the leak count for the reward penalty, and the log filter."""

from __future__ import annotations

import logging

import pytest

from serving.pii import (
    RedactingFilter,
    find_pii,
    iban_ok,
    leak_count,
    luhn_ok,
    mean_leaks,
    redact,
)

TEXT = ("Mail Bob.Smith@example.co.uk, call +1 (415) 555-0100 or 020 7946 0958. SSN 123-45-6789, "
        "card 4111 1111 1111 1111, IBAN GB82 WEST 1234 5698 7654 32 or DE89370400440532013000.")


def test_each_kind_is_found_with_its_span():
    got = [(m.kind, m.value) for m in find_pii(TEXT)]
    assert got == [("email", "Bob.Smith@example.co.uk"), ("phone", "+1 (415) 555-0100"),
                   ("phone", "020 7946 0958"), ("ssn", "123-45-6789"),
                   ("credit_card", "4111 1111 1111 1111"),
                   ("iban", "GB82 WEST 1234 5698 7654 32"), ("iban", "DE89370400440532013000")]
    for m in find_pii(TEXT):
        assert TEXT[m.start:m.end] == m.value


def test_checksums_keep_ordinary_numbers_out():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("GB82WEST12345698765432") and not iban_ok("GB82WEST12345698765433")
    assert not iban_ok("DE8937040044053201300")  # German IBANs have 22 characters
    clean = ("Born 1990-05-12, founded in 2001 with 1500 employees; pages 12-34; pi 3.14159; "
             "card 4111 1111 1111 1112; SSN 000-12-3456 and 666-12-3456; ids 12345678; "
             "ISBN 978-3-16-148410-0 printed in 1987.")
    assert find_pii(clean) == [], find_pii(clean)


def test_no_false_positives_on_the_synthetic_world(world):
    texts = [p.text for p in list(world.corpus)[:300]] + [e.question for e in world.examples]
    texts += [a for e in world.examples for a in e.answers]
    hits = [(t, m) for t in texts for m in find_pii(t)]
    assert hits == []


def test_redact_and_kind_selection():
    assert redact(TEXT).count("[PHONE]") == 2 and "@" not in redact(TEXT)
    assert redact("mail a@b.io, SSN 123-45-6789", kinds=["ssn"]) == "mail a@b.io, SSN [SSN]"
    assert redact("nothing here") == "nothing here"


def test_leak_count_ignores_pii_from_the_inputs():
    q = "What is the support address, support@acme.com?"
    ctx = ["Acme support: support@acme.com, phone +1 415 555 0100."]
    assert leak_count("Write to SUPPORT@acme.com [1]", q, ctx) == 0  # case-insensitive
    assert leak_count("Call +1-415-555-0100", q, ctx) == 0  # same digits, other separators
    assert leak_count("Write to ceo@acme.com or 123-45-6789", q, ctx) == 2
    assert leak_count("Write to support@acme.com", q, ctx, mode="any") == 1
    assert mean_leaks(["ceo@acme.com", "fine", "x@y.org z@w.org"], ["", "", ""]) == 1.0
    with pytest.raises(ValueError):
        leak_count("a", mode="some")
    with pytest.raises(ValueError):
        mean_leaks(["a"], [])


def test_log_filter_redacts_messages_args_and_tracebacks(caplog):
    logger = logging.getLogger("test.pii")
    logger.addFilter(RedactingFilter())
    try:
        with caplog.at_level(logging.INFO, logger="test.pii"):
            logger.info("question from %s: %s", "bob@x.org", "card 4111-1111-1111-1111")
            try:
                raise ValueError("bad SSN 123-45-6789")
            except ValueError:
                logger.exception("failed for jane@x.org")
        text = caplog.text
        assert "bob@x.org" not in text and "4111" not in text and "123-45-6789" not in text
        assert "[EMAIL]" in text and "[CREDIT_CARD]" in text and "[SSN]" in text
        assert "ValueError" in text  # the traceback is kept, only redacted
    finally:
        logger.filters.clear()
