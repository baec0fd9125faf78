"""The gate the reference judge's tests drive: the test contracts, loaded once per session."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reference import traffic
from tests.reference.gate import RealGate, write_contracts

#: the bounds the gates are judged under: the settings' defaults, and bounds so tight that the
#: generated calls pass them (bytes, pieces, nesting)
LIMITS = {"defaults": {}, "tight": {"max_bytes": 48, "max_chunks": 4, "max_depth": 3}}


@pytest.fixture(scope="session")
def contracts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_contracts(tmp_path_factory.mktemp("contracts"), traffic.SCHEMAS)


#: a vendor call's pieces are what its adapter makes of the events (an opening, the deltas, a
#: close, as the adapter chooses): the README does not count them, so vendor streams are
#: judged under the bounds on bytes and nesting only
VENDOR_LIMITS = {"defaults": {}, "tight": {"max_bytes": 48, "max_depth": 3}}


@pytest.fixture(scope="session", params=sorted(LIMITS))
def gate(request: pytest.FixtureRequest, contracts: Path) -> RealGate:
    return RealGate(contracts, traffic.SCHEMAS, **LIMITS[request.param])


@pytest.fixture(scope="session", params=sorted(VENDOR_LIMITS))
def vendor_gate(request: pytest.FixtureRequest, contracts: Path) -> RealGate:
    return RealGate(contracts, traffic.SCHEMAS, **VENDOR_LIMITS[request.param])


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
