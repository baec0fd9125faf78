"""The demo's payments database: SQLite, one row per payment, unique on its idempotency key.

The executor passes each call's idempotency key to its handler so that a system behind it can
deduplicate; this is such a system. `pay` inserts the payment unless its key is there already,
and returns the payment's id either way, in one SQLite transaction: a handler run again after
an executor died during it (it is safe to retry) finds the row the first run committed.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    amount_minor INTEGER NOT NULL,
    currency TEXT NOT NULL,
    recipient TEXT NOT NULL,
    event_id TEXT NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class Payment:
    id: int
    idempotency_key: str
    amount_minor: int
    currency: str
    recipient: str
    #: the call whose run inserted it
    event_id: str


class Payments:
    """The payments table of one SQLite file (made if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level="IMMEDIATE")

    def pay(
        self, key: str, amount_minor: int, currency: str, recipient: str, event_id: str
    ) -> tuple[Payment, bool]:
        """The payment under `key`, and whether this call made it (False: it was there)."""
        connection = self._connect()
        try:
            with connection as db:
                inserted = db.execute(
                    "INSERT INTO payments "
                    "(idempotency_key, amount_minor, currency, recipient, event_id) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(idempotency_key) DO NOTHING",
                    (key, amount_minor, currency, recipient, event_id),
                ).rowcount
                row = db.execute(
                    "SELECT id, idempotency_key, amount_minor, currency, recipient, event_id "
                    "FROM payments WHERE idempotency_key = ?",
                    (key,),
                ).fetchone()
        finally:
            connection.close()
        return Payment(*row), inserted == 1

    def all(self) -> list[Payment]:
        connection = self._connect()
        try:
            rows = connection.execute(
                "SELECT id, idempotency_key, amount_minor, currency, recipient, event_id "
                "FROM payments ORDER BY id"
            ).fetchall()
        finally:
            connection.close()
        return [Payment(*row) for row in rows]
