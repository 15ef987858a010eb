"""The kinds of value a setting of ``murmur run`` holds, as annotated types of the schema
(:mod:`node.settings`): what one value may be, and how a string that a user writes becomes one.

Addresses and devices are checked; rates (``2MB/s``), byte budgets (``500MB/day``) and daily
windows of hours (``22:00-06:00``) are parsed from what users write. Like the schema, this
imports neither torch nor the node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ByteSize,
    Field,
    TypeAdapter,
    ValidationError,
)
from pydantic_settings import NoDecode

from node.daemon.pacing import MIN_UPLOAD_RATE

__all__ = [
    "PERIOD_UNITS",
    "ActiveHours",
    "Address",
    "Addresses",
    "AtLeastOne",
    "ByteBudgetSpec",
    "Device",
    "Fraction",
    "PathSetting",
    "Percent",
    "Positive",
    "UploadRate",
    "parse_budget",
]

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port (e.g. 0.0.0.0:7070)")
    return address


def _check_device(device: str) -> str:
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


def _addresses(value: object) -> object:
    """A list of addresses; a string is one address (or several, comma-separated, as an
    environment variable holds them)."""
    if isinstance(value, str):
        return tuple(a.strip() for a in value.split(",") if a.strip())
    if isinstance(value, list):
        return tuple(value)
    return value


Address = Annotated[str, AfterValidator(_check_address)]
Addresses = Annotated[tuple[Address, ...], NoDecode, BeforeValidator(_addresses)]
Device = Annotated[str, AfterValidator(_check_device)]
# Paths come as strings from every source; a strict Path would refuse them all.
PathSetting = Annotated[Path, Field(strict=False)]
Positive = Annotated[float, Field(gt=0)]
AtLeastOne = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0, lt=1)]
Percent = Annotated[float, Field(gt=0, le=100)]


def _per_second(value: object) -> object:
    """A rate as users write it: ``2MB/s`` is ``2MB`` a second."""
    if isinstance(value, str) and value.strip().lower().endswith("/s"):
        return value.strip()[:-2]
    return value


#: Bytes per second, with units (200KB, 2MiB, 2MB/s): pydantic's ByteSize.
UploadRate = Annotated[ByteSize, BeforeValidator(_per_second), Field(ge=MIN_UPLOAD_RATE)]

#: Seconds in a budget's period, by the unit users write (``500MB/day``, ``2GB/30d``).
PERIOD_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
}
_BYTES = TypeAdapter(ByteSize)
_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*$")


def parse_budget(value: object) -> object:
    """``BYTES/PERIOD`` (``500MB/day``, ``2GiB/week``, ``50MB/6h``) as (bytes, seconds)."""
    if not isinstance(value, str):
        return value
    amount, slash, period = value.partition("/")
    if not slash:
        raise ValueError(f"a byte budget is BYTES/PERIOD, such as 500MB/day; got {value!r}")
    try:
        nbytes = int(_BYTES.validate_python(amount.strip()))
    except ValidationError:
        raise ValueError(
            f"{amount.strip()!r} in the byte budget {value!r} is not a size (500MB, 2GiB)"
        ) from None
    found = _PERIOD.match(period.lower())
    if found is None or found.group(2) not in PERIOD_UNITS:
        raise ValueError(
            f"unknown period {period!r} in the byte budget {value!r}: a number (optional) and "
            f"one of {', '.join(sorted(PERIOD_UNITS))}"
        )
    count = float(found.group(1)) if found.group(1) else 1.0
    return (nbytes, count * PERIOD_UNITS[found.group(2)])


def _positive_budget(value: tuple[int, float]) -> tuple[int, float]:
    nbytes, period_s = value
    if nbytes <= 0 or period_s <= 0:
        raise ValueError("a byte budget needs a positive number of bytes and a positive period")
    return value


#: A byte budget per period: (bytes, seconds).
ByteBudgetSpec = Annotated[
    tuple[int, float], BeforeValidator(parse_budget), AfterValidator(_positive_budget)
]


def _hours(value: object) -> object:
    from node.daemon.power import parse_hours  # light: no torch

    return parse_hours(value) if isinstance(value, str) else value


#: A daily window of local time, ``22:00-06:00``, as minutes after midnight (start, end).
ActiveHours = Annotated[tuple[int, int], BeforeValidator(_hours)]
