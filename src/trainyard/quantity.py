"""Kubernetes resource quantities (``500m``, ``1Gi``, ``2T``, ``1e3``) and OSMO durations.

Sources: Kubernetes API reference, "Quantity" (suffixes: decimal ``n u m k M G T P E``,
binary ``Ki Mi Gi Ti Pi Ei``, and decimal exponents); OSMO docs, "Timeouts" (``30s``, ``5m``,
``8h``, ``2d`` or bare seconds, one unit only).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_quantity", "parse_duration_s", "format_bytes", "format_duration_s"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
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
_QUANTITY = re.compile(
    r"^([+]?[0-9]+(?:\.[0-9]*)?|[+]?\.[0-9]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
)
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
_DURATION_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into a plain number (bytes for memory, cores for cpu).

    Args:
        value: an int, a float, or a string such as ``"1Gi"``, ``"500m"``, ``"1.5"``.

    Returns:
        The value as a Decimal (``"1Gi"`` -> 1073741824, ``"500m"`` -> 0.5).

    Raises:
        ValueError: not a quantity, or negative; the message names the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}; write one such as 1Gi, 500m or 4")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a quantity cannot be negative, got {value!r}; give zero or more")
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(
            f"invalid quantity {text!r}; write one such as 1Gi, 512Mi, 500m or 4 (Kubernetes syntax)"
        )
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number + (exponent or ""))
    except InvalidOperation as exc:  # pragma: no cover - regex admits only valid numbers
        raise ValueError(f"not a number: {text!r}") from exc
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix or ""]


def parse_duration_s(value: object) -> float:
    """Parse an OSMO duration (``30s``, ``5m``, ``8h``, ``2d``, or bare seconds) to seconds.

    Raises:
        ValueError: mixed units (``1h30m``), an unknown unit, or a negative value.
    """
    if isinstance(value, bool):
        raise ValueError(
            f"invalid duration {value!r}; write one such as 30s, 5m, 8h, 2d or seconds"
        )
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}; give zero or more")
        return float(value)
    text = str(value).strip()
    match = _DURATION.match(text)
    if not match:
        raise ValueError(
            f"invalid duration {text!r}; write it with one unit such as 30s, 5m, 8h, 2d or bare seconds"
        )
    number, unit = match.groups()
    return float(number) * _DURATION_UNIT_S[unit]


def format_bytes(count: int) -> str:
    """A byte count for people: in the largest binary unit that holds it exactly (as long
    as the number stays under ten million), else in the largest unit it reaches, to 0.1.

    ``1073741824`` -> ``"1Gi"``, ``1000000 * 2**30`` -> ``"1000000Gi"``, ``1536`` ->
    ``"1.5Ki"``, ``1000`` -> ``"1000"``. Exact forms parse back: ``parse_quantity``.
    """
    units = sorted(_BINARY.items(), key=lambda kv: -kv[1])
    for suffix, size in units:
        if count >= size and count % size == 0 and count // size < 10**7:
            return f"{count // size}{suffix}"
    for suffix, size in units:
        if count >= size:
            return f"{count / size:.1f}{suffix}"
    return str(count)


def format_duration_s(seconds: float) -> str:
    """A duration in the largest OSMO unit that holds it exactly (``90`` -> ``"90s"``,
    ``7200`` -> ``"2h"``). ``parse_duration_s(format_duration_s(s)) == s`` for s >= 0."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds!r}"
