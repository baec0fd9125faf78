"""Unique names for the integration tests' topics and groups.

What the old runner tests kept here moved to `tests/support/`: traffic (`traffic.py`), reading
and checking outcomes (`outcomes.py`), worker processes (`workers.py`).
"""

from __future__ import annotations

import uuid


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"
