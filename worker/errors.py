"""The exception tree. Expected rejections are values (see `worker.model`), never exceptions.

Exceptions are for bugs, bad configuration and infrastructure; every one callgate raises on
purpose derives from `CallgateError`:

    CallgateError
    ├── ConfigError               a setting is wrong; start-up stops with its message (status 2)
    ├── SchemaLoadError           a contract cannot be loaded or compiled; names file and pointer
    │   └── UnsupportedKeywordError   the chosen engine would not enforce a keyword
    ├── InputFormatError          a record or input line is not what its format says (the
    │                             record becomes its own rejected call; it never escapes a round)
    └── InfrastructureError       a dependency failed: the network, a port, a broker
        ├── BrokerError               Kafka refused to work with the worker (status 1)
        └── StateError                state the worker must keep cannot be written or read (a
                                      changelog refusing writes, a checkpoint of another
                                      layout): the worker stops rather than judge without it
                                      (status 1)

Anything else raised while judging one call is a bug; it becomes that call's `internal_error`
rejection (`worker.core.pipeline.Gate.judge`), never a stopped worker.
"""

from __future__ import annotations


class CallgateError(Exception):
    """Root of every exception callgate raises on purpose."""


class ConfigError(CallgateError):
    """A setting is missing, malformed or contradicts another one."""


class SchemaLoadError(CallgateError):
    """A schema file cannot be read, parsed or compiled."""

    def __init__(self, message: str, *, file: str | None = None) -> None:
        self.file = file
        super().__init__(f"{file}: {message}" if file else message)


class UnsupportedKeywordError(SchemaLoadError):
    """The schema uses a keyword the engine does not enforce as the schema's draft means it."""

    def __init__(self, keyword: str, *, file: str | None, pointer: str, engine: str) -> None:
        self.keyword = keyword
        self.pointer = pointer
        self.engine = engine
        super().__init__(
            f"keyword {keyword!r} at {pointer or '/'} is not enforced by engine {engine!r}; "
            "refusing to load a schema that would silently accept invalid data",
            file=file,
        )


class InputFormatError(CallgateError):
    """An input record or line does not match its declared format."""


class InfrastructureError(CallgateError):
    """A dependency failed: the network, a port, a broker."""


class BrokerError(InfrastructureError):
    """A Kafka operation (fetch, produce, commit) failed."""


class StateError(InfrastructureError):
    """Checkpointed state cannot be written or read back."""
