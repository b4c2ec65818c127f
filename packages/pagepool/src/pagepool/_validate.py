"""Argument checks shared by the public entry points (package-private)."""

from __future__ import annotations

from pagepool.errors import InvalidArgument


def as_int(value: object, name: str, *, minimum: int = 0) -> int:
    """Return `value` as an int if it is an integer (not a bool) >= `minimum`.

    Raises:
        InvalidArgument: With the name, the value received and the rule.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgument(f"{name} must be an int >= {minimum}, got {value!r}")
    number = value.__index__()  # accepts numpy integers as well as int
    if number < minimum:
        raise InvalidArgument(f"{name} must be an int >= {minimum}, got {number}")
    return number
