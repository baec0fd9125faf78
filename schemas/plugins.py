"""The rules and version adapters of the contracts shipped in `schemas/`.

- `weather.get_weather`: v1 had no `days`; the internal shape is v2's, with one day by default.
- `payments.create_payment`: a per-currency ceiling on `amount_minor`, which depends on how many
  minor units the currency has (a cross-field rule a plain schema cannot state clearly).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from worker.model import Violation
from worker.plugins import Plugins, RuleContext

#: The largest single payment, in major units, and each currency's minor-unit exponent.
MAX_PAYMENT_MAJOR = 1_000_000
MINOR_UNIT_EXPONENT: Mapping[str, int] = {"JPY": 0, "KRW": 0, "KWD": 3, "BHD": 3}


def weather_v1_to_internal(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"city": arguments["city"], "units": arguments["units"], "days": 1}


def weather_v2_to_internal(arguments: Mapping[str, Any]) -> dict[str, Any]:
    days = arguments.get("days")
    return {"city": arguments["city"], "units": arguments["units"], "days": days or 1}


def payment_within_ceiling(
    arguments: Mapping[str, Any], context: RuleContext
) -> Iterable[Violation]:
    currency = arguments.get("currency")
    amount = arguments.get("amount_minor")
    if not isinstance(currency, str) or not isinstance(amount, int):
        return ()
    ceiling = MAX_PAYMENT_MAJOR * 10 ** MINOR_UNIT_EXPONENT.get(currency, 2)
    if amount > ceiling:
        message = f"must be at most {ceiling} minor units of {currency} in one payment"
        return (Violation("/amount_minor", "maxPaymentAmount", message),)
    return ()


def register(plugins: Plugins) -> None:
    plugins.adapter("weather.get_weather", "1")(weather_v1_to_internal)
    plugins.adapter("weather.get_weather", "2")(weather_v2_to_internal)
    plugins.rule("payments.create_payment")(payment_within_ceiling)
