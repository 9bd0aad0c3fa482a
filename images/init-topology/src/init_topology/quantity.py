"""Kubernetes resource quantities (`8`, `1k`, `500m`, `2Ki`) read as exact numbers."""

from __future__ import annotations

import re
from decimal import Context, Decimal

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
#: Longer text is no count of devices (and int -> str refuses > 4300 digits).
_MAX_QUANTITY_CHARS = 40
#: Enough digits that no quantity of that length is rounded.
_EXACT = Context(prec=4 * _MAX_QUANTITY_CHARS)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity(text: str) -> Decimal | None:
    """A Kubernetes quantity (`8`, `1k` as the API writes 1000, `500m`, `1e3`, `2Ki`);
    None if the text is not one, or is too long or too large to be a count of anything."""
    match = _QUANTITY.fullmatch(text.strip()) if len(text) <= _MAX_QUANTITY_CHARS else None
    if match is None:
        return None
    number = Decimal(match["number"])
    if match["binary"]:
        return _EXACT.multiply(number, Decimal(_BINARY[match["binary"]]))
    exponent = _DECIMAL[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
    if abs(exponent) > _MAX_QUANTITY_CHARS:
        return None
    return number.scaleb(exponent, context=_EXACT)


def whole(text: str) -> int | None:
    """A whole, non-negative quantity, else None (GPU and RDMA counts are whole numbers)."""
    value = quantity(text)
    if value is None or value < 0 or value != value.to_integral_value():
        return None
    return int(value)


def positive(text: str | None) -> bool:
    """A quantity above zero (a device plugin advertising at least one device)."""
    value = quantity(text or "")
    return value is not None and value > 0
