"""Kubernetes resource.Quantity for byte counts (pure).

`status.size` is a Quantity. We write the canonical BinarySI form the Go library prints
for an integer byte count: the largest power-of-1024 suffix that divides it exactly,
otherwise the plain integer (resource.NewQuantity(n, resource.BinarySI).String()).
"""

from __future__ import annotations

import re
from decimal import Decimal

_BINARY = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_PATTERN = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>[KMGTPE]i)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE])?)$"
)


def format_bytes(count: int) -> str:
    """Canonical BinarySI Quantity string of a non-negative byte count."""
    if count < 0:
        raise ValueError(f"a size cannot be negative: {count}")
    for suffix, unit in _BINARY:
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def parse(quantity: int | str) -> Decimal:
    """The value of a Quantity (int or string form) as a Decimal."""
    if isinstance(quantity, int):
        return Decimal(quantity)
    match = _PATTERN.match(quantity.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    number = Decimal(match["num"])
    if match["bin"]:
        return number * dict(_BINARY)[match["bin"]]
    if match["exp"]:
        return number * (Decimal(10) ** int(match["exp"][1:]))
    return number * _DECIMAL[match["dec"] or ""]
