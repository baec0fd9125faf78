"""What the tests of client requests no longer waited for (`worker.runtime.kafka.Requests`)
watch: the lines that say how each ended, and every exception the event loop found never
retrieved."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Watched:
    #: what was said of requests no longer waited for
    lines: list[str] = field(default_factory=list)
    #: what the loop's exception handler was handed ("... was never retrieved")
    unread: list[dict[str, Any]] = field(default_factory=list)


class _Said(logging.Handler):
    def __init__(self, watched: Watched) -> None:
        super().__init__(logging.DEBUG)
        self._watched = watched

    def emit(self, record: logging.LogRecord) -> None:
        if "no longer waited for" in record.getMessage():
            self._watched.lines.append(record.getMessage())


@contextlib.contextmanager
def unwaited(logger: str) -> Iterator[Watched]:
    """Within it, the running loop's exception handler and `logger`'s INFO lines are watched."""
    watched = Watched()
    said = _Said(watched)
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(said)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: watched.unread.append(context))
    try:
        yield watched
    finally:
        log.removeHandler(said)
        log.setLevel(level)
        loop.set_exception_handler(None)
