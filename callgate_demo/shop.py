"""The demo's payments database: SQLite, one row per payment and one per refund, each table
unique on its idempotency key.

The executor passes each call's idempotency key to its handler so that a system behind it can
deduplicate; this is such a system. `pay` (and `refund`) inserts the row unless its key is there
already, and returns the row either way, in one SQLite transaction: a handler run again after
an executor died during it (it is safe to retry) finds the row the first run committed.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    amount_minor INTEGER NOT NULL,
    currency TEXT NOT NULL,
    recipient TEXT NOT NULL,
    event_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    payment_id TEXT NOT NULL,
    amount_minor INTEGER NOT NULL,
    currency TEXT NOT NULL,
    event_id TEXT NOT NULL
)
"""
_PAYMENT_COLUMNS = ("idempotency_key", "amount_minor", "currency", "recipient", "event_id")
_REFUND_COLUMNS = ("idempotency_key", "payment_id", "amount_minor", "currency", "event_id")


@dataclass(frozen=True, slots=True)
class Payment:
    id: int
    idempotency_key: str
    amount_minor: int
    currency: str
    recipient: str
    #: the call whose run inserted it
    event_id: str


@dataclass(frozen=True, slots=True)
class Refund:
    id: int
    idempotency_key: str
    payment_id: str
    amount_minor: int
    currency: str
    #: the call whose run inserted it
    event_id: str


class Payments:
    """The payments table of one SQLite file (made if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level="IMMEDIATE")

    def pay(
        self, key: str, amount_minor: int, currency: str, recipient: str, event_id: str
    ) -> tuple[Payment, bool]:
        """The payment under `key`, and whether this call made it (False: it was there)."""
        row, inserted = self._insert_once(
            "payments", _PAYMENT_COLUMNS, (key, amount_minor, currency, recipient, event_id)
        )
        return Payment(*row), inserted

    def refund(
        self, key: str, payment_id: str, amount_minor: int, currency: str, event_id: str
    ) -> tuple[Refund, bool]:
        """The refund under `key`, and whether this call made it (False: it was there)."""
        row, inserted = self._insert_once(
            "refunds", _REFUND_COLUMNS, (key, payment_id, amount_minor, currency, event_id)
        )
        return Refund(*row), inserted

    def _insert_once(
        self, table: str, columns: tuple[str, ...], values: tuple[object, ...]
    ) -> tuple[tuple[Any, ...], bool]:
        """The row of `table` under the idempotency key (`values[0]`), inserted unless it is
        there, and whether this call inserted it; one transaction."""
        names = ", ".join(columns)
        connection = self._connect()
        try:
            with connection as db:
                inserted = db.execute(
                    f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))}) "
                    "ON CONFLICT(idempotency_key) DO NOTHING",
                    values,
                ).rowcount
                row = db.execute(
                    f"SELECT id, {names} FROM {table} WHERE idempotency_key = ?", (values[0],)
                ).fetchone()
        finally:
            connection.close()
        return tuple(row), inserted == 1

    def all(self) -> list[Payment]:
        return [Payment(*row) for row in self._rows("payments", _PAYMENT_COLUMNS)]

    def refunds(self) -> list[Refund]:
        return [Refund(*row) for row in self._rows("refunds", _REFUND_COLUMNS)]

    def _rows(self, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        connection = self._connect()
        try:
            rows = connection.execute(
                f"SELECT id, {', '.join(columns)} FROM {table} ORDER BY id"
            ).fetchall()
        finally:
            connection.close()
        return [tuple(row) for row in rows]
