"""The demo's payments database: payments and refunds, each stored once per idempotency key."""

from __future__ import annotations

from pathlib import Path

from callgate_demo.shop import Payments


def test_a_refund_is_stored_once_per_key_and_apart_from_payments(tmp_path: Path) -> None:
    shop = Payments(tmp_path / "payments.db")
    payment, made = shop.pay("k-1", 1250, "EUR", "acct_4711", "e1")
    assert made
    refund, made = shop.refund("k-1", "pay_4711", 1250, "EUR", "e2")
    assert made  # another table: the same key names another row
    again, made = shop.refund("k-1", "pay_4711", 1250, "EUR", "e3")
    assert (again, made) == (refund, False)  # the row the first run committed
    assert (refund.payment_id, refund.amount_minor, refund.event_id) == ("pay_4711", 1250, "e2")
    assert shop.all() == [payment]
    assert shop.refunds() == [refund]
    # a second handle on the same file sees both
    assert Payments(tmp_path / "payments.db").refunds() == [refund]
