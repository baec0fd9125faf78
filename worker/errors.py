"""The exception tree. Expected rejections are values (see `worker.model`), never exceptions.

Exceptions are for bugs, bad configuration and infrastructure; every one derives from
`CallgateError` and says through `retriable` whether trying the same operation again may help:

    CallgateError                 (retriable: False)
    ├── ConfigError               a setting is wrong; start-up stops with its message
    ├── SchemaLoadError           a contract cannot be loaded or compiled; names file and keyword
    │   └── UnsupportedKeywordError   the chosen engine would not enforce a keyword
    ├── InputFormatError          a record or input line is not what its format says
    └── InfrastructureError       (retriable: True) broker, network, a dependency that may recover
        ├── BrokerError               Kafka produce, fetch or commit failed
        └── BrokerStartError          the embedded broker did not come up (retriable: False)
"""

from __future__ import annotations


class CallgateError(Exception):
    """Root of every exception callgate raises on purpose."""

    retriable: bool = False


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
    """A dependency failed in a way that may recover on its own."""

    retriable = True


class BrokerError(InfrastructureError):
    """A Kafka operation (fetch, produce, commit) failed."""


class BrokerStartError(InfrastructureError):
    """The embedded broker process did not start or did not answer in time."""

    retriable = False
