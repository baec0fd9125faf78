"""The ReDoS guard and the ECMA-262 translation for Python's `re`."""

from __future__ import annotations

import re

import pytest

from worker.schemas.patterns import backtracking_risk, python_error, to_python


@pytest.mark.parametrize(
    "pattern", ["^(a+)+$", "(\\w+\\s?)+$", "(a|aa)+$", "(.*,)*x", "^(a*)*b", "((ab)*c?)+d"]
)
def test_catastrophic_patterns_are_flagged(pattern: str) -> None:
    assert backtracking_risk(pattern) is not None


@pytest.mark.parametrize(
    "pattern",
    ["^[a-z]+(-[a-z]+)*$", "^(?:[a-z0-9]+\\.)+[a-z]{2,}$", "(foo|bar)+", "^\\d{3}-\\d{4}$", "^a+$"],
)
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert backtracking_risk(pattern) is None


def test_ecma_translation() -> None:
    assert re.search(to_python("^a$"), "a\n") is None
    assert re.search(to_python("^[$]$"), "$")
    assert re.search(to_python("^\\d$"), "\u0664") is None
    assert re.search(to_python("^.$"), "\r") is None
    assert re.search(to_python("^[^]$"), "\n")
    assert re.search(to_python("a[]"), "a") is None
    assert python_error("\\p{L}") is not None
    assert python_error("^[a-z]+$") is None
