"""What the device's power supply and thermal state say, and the policy that pauses a node on
them (node/daemon/pause.py reads the device and keeps the pause).

The readings come from Linux sysfs: ``class/power_supply`` (each supply's ``type``, a battery's
``capacity`` and ``status``, an external supply's ``online``) and ``class/thermal`` (each zone's
``temp`` in millidegrees Celsius). Anything that cannot be read is skipped, never raised: sysfs
files answer EINVAL or EACCES on some machines, and a container may have no ``class`` at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

__all__ = [
    "BATTERY_HYSTERESIS_PCT",
    "SYSFS_ROOT",
    "THERMAL_HYSTERESIS_C",
    "DeviceReading",
    "PausePolicy",
    "format_hours",
    "minute_of_day",
    "parse_hours",
    "read_device",
]

SYSFS_ROOT = Path("/sys")
#: Points of battery charge above the threshold before a battery pause ends (no flapping).
BATTERY_HYSTERESIS_PCT = 5.0
#: Degrees below the limit before a thermal pause ends.
THERMAL_HYSTERESIS_C = 5.0

#: Battery statuses that say an external supply feeds the device even where none is listed.
_ON_SUPPLY_STATUSES = frozenset({"Charging", "Full"})
#: Below absolute zero: a zone that reads this is broken, not cold.
_ABSOLUTE_ZERO_C = -273.15
_HOURS_RE = re.compile(r"\s*(\d{1,2})(?::(\d{2}))?\s*-\s*(\d{1,2})(?::(\d{2}))?\s*")


@dataclass(frozen=True)
class DeviceReading:
    """Args:
    on_ac: an external supply powers the device (a machine that lists no supply at all, a
        server or a container, counts as on AC).
    battery_pct: mean capacity of the batteries in percent; None: no readable battery.
    temp_c: the hottest thermal zone in °C; None: no readable zone.
    """

    on_ac: bool
    battery_pct: float | None
    temp_c: float | None


def _read(path: Path) -> str | None:
    """The stripped text of a sysfs file; None where it cannot be read."""
    try:
        return path.read_text().strip()
    except (OSError, ValueError):  # ValueError: UnicodeDecodeError on a garbage file
        return None


def _entries(folder: Path, pattern: str = "*") -> list[Path]:
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def read_device(root: Path = SYSFS_ROOT) -> DeviceReading:
    """Read the power supplies and thermal zones under ``root`` (``/sys``, or a fake tree).

    A battery with no readable ``capacity`` still counts as a battery (for whether the device is
    on AC) but not in the mean. Supplies whose ``scope`` is ``Device`` (a wireless mouse's
    battery) power a peripheral, not this device, and are left out.
    """
    capacities: list[float] = []
    battery_statuses: list[str] = []
    batteries = 0
    externals = 0
    external_online = False
    for supply in _entries(root / "class" / "power_supply"):
        kind = _read(supply / "type")
        if kind is None or _read(supply / "scope") == "Device":
            continue
        if kind == "Battery":
            batteries += 1
            battery_statuses.append(_read(supply / "status") or "Unknown")
            capacity = _read(supply / "capacity")
            try:
                value = int(capacity) if capacity is not None else None
            except ValueError:
                value = None
            if value is not None:
                capacities.append(float(min(max(value, 0), 100)))
        else:
            externals += 1
            external_online = external_online or _read(supply / "online") == "1"
    on_ac = external_online or (
        externals == 0
        and (batteries == 0 or any(s in _ON_SUPPLY_STATUSES for s in battery_statuses))
    )
    temps: list[float] = []
    for zone in _entries(root / "class" / "thermal", "thermal_zone*"):
        text = _read(zone / "temp")
        if text is None:
            continue
        try:
            celsius = int(text) / 1000
        except ValueError:
            continue
        if celsius >= _ABSOLUTE_ZERO_C:
            temps.append(celsius)
    return DeviceReading(
        on_ac=on_ac,
        battery_pct=sum(capacities) / len(capacities) if capacities else None,
        temp_c=max(temps) if temps else None,
    )


@dataclass(frozen=True)
class PausePolicy:
    """When the device's state pauses the node; every rule is off unless set.

    Args:
        battery_below: pause on battery below this charge in percent.
        above_temp: pause while the hottest zone is above this many °C.
        only_on_ac: pause while the device is not on AC power.
        active_hours: run only inside ``[start, end)``, minutes after local midnight; the
            window wraps past midnight when ``end < start``, and ``start == end`` is all day.
    """

    battery_below: float | None = None
    above_temp: float | None = None
    only_on_ac: bool = False
    active_hours: tuple[int, int] | None = None

    @property
    def active(self) -> bool:
        """Whether any rule is set (so that the node need read the device at all)."""
        return (
            self.battery_below is not None
            or self.above_temp is not None
            or self.only_on_ac
            or self.active_hours is not None
        )

    def reasons(
        self, reading: DeviceReading, minute_of_day: int, held: frozenset[str] = frozenset()
    ) -> dict[str, str]:
        """Reasons to be paused now, by key (``battery``, ``temperature``, ``ac``, ``hours``),
        each one human line.

        Args:
            reading: the device now.
            minute_of_day: local time of day, in minutes after midnight.
            held: the keys that hold the node paused now. A held battery pause ends only at
                ``battery_below`` + :data:`BATTERY_HYSTERESIS_PCT` (or on AC), a held
                temperature pause only at or below ``above_temp`` - :data:`THERMAL_HYSTERESIS_C`,
                so that a reading hovering at the limit does not pause and resume the node
                every poll.
        """
        found: dict[str, str] = {}
        if not self.active:
            return found
        pct = reading.battery_pct
        if self.battery_below is not None and not reading.on_ac and pct is not None:
            limit = self.battery_below + (BATTERY_HYSTERESIS_PCT if "battery" in held else 0.0)
            if pct < limit:
                found["battery"] = (
                    f"on battery at {pct:.0f}% (the policy pauses below {self.battery_below:g}%)"
                )
        temp = reading.temp_c
        if self.above_temp is not None and temp is not None:
            limit = self.above_temp - (THERMAL_HYSTERESIS_C if "temperature" in held else 0.0)
            if temp > limit:
                found["temperature"] = (
                    f"at {temp:.1f} °C (the policy pauses above {self.above_temp:g} °C)"
                )
        if self.only_on_ac and not reading.on_ac:
            found["ac"] = "not on AC power (--only-on-ac)"
        if self.active_hours is not None and not _inside(self.active_hours, minute_of_day):
            found["hours"] = f"outside the active hours {format_hours(self.active_hours)}"
        return found


def _inside(window: tuple[int, int], minute: int) -> bool:
    start, end = window
    if start == end:
        return True
    if start < end:
        return start <= minute < end
    return minute >= start or minute < end


def parse_hours(text: str) -> tuple[int, int]:
    """A window of local time, ``22:00-06:00`` (also ``9:00-17:30``, or ``22-6`` in whole
    hours), as minutes after midnight.

    Raises:
        ValueError: the text is no such window (hours run 0..24, ``24:00`` only as the end;
            minutes 0..59).
    """
    match = _HOURS_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"active hours {text!r} are not of the form HH:MM-HH:MM (e.g. 22:00-06:00)"
        )
    start_h, start_m, end_h, end_m = match.groups()

    def minutes(hours: str, mins: str | None, end: bool) -> int:
        h, m = int(hours), int(mins or 0)
        if m > 59:
            raise ValueError(f"active hours {text!r}: minutes run 0..59")
        if h > 24 or (h == 24 and (m != 0 or not end)):
            raise ValueError(f"active hours {text!r}: hours run 0..23 (24:00 only as the end)")
        return h * 60 + m

    return minutes(start_h, start_m, False), minutes(end_h, end_m, True)


def format_hours(window: tuple[int, int]) -> str:
    """``(1320, 360)`` → ``22:00-06:00``."""
    start, end = window
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


def minute_of_day(now: datetime) -> int:
    """Minutes since local midnight of ``now``'s wall time (an aware time is made local)."""
    if now.tzinfo is not None:
        now = now.astimezone()
    return now.hour * 60 + now.minute
