"""The gate the reference judge's tests drive: the test contracts, loaded once per session."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from tests.reference import traffic
from tests.reference.gate import RealGate, write_contracts


@pytest.fixture(scope="session")
def gate(tmp_path_factory: pytest.TempPathFactory) -> RealGate:
    contracts = write_contracts(tmp_path_factory.mktemp("contracts"), traffic.SCHEMAS)
    return RealGate(contracts, traffic.SCHEMAS)


#: `make fuzz` runs the reference judge's properties again and again for this many seconds
#: (fresh random examples each round); 0 in CI: each property runs its bounded examples once
SECONDS = float(os.environ.get("JUDGE_SECONDS", "0"))

#: the pytest timeout of a reference test: its CI bound, or the fuzzing time and that bound
TIMEOUT = 300 + SECONDS


def repeat(run: Callable[[], None]) -> None:
    """`run` (a Hypothesis test) once, then again while `SECONDS` last."""
    deadline = time.monotonic() + SECONDS
    run()
    while time.monotonic() < deadline:
        run()
