"""The device's state (node/daemon/power.py) read from fake sysfs trees, and the pause policy:
each rule, its hysteresis, the active hours and their parsing."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.daemon.power import (
    BATTERY_HYSTERESIS_PCT,
    THERMAL_HYSTERESIS_C,
    DeviceReading,
    PausePolicy,
    format_hours,
    minute_of_day,
    parse_hours,
    read_device,
)


def supply(root: Path, name: str, **files: str) -> Path:
    folder = root / "class" / "power_supply" / name
    folder.mkdir(parents=True)
    for key, text in files.items():
        (folder / key).write_text(text + "\n")
    return folder


def battery(root: Path, capacity: str = "50", status: str = "Discharging", name: str = "BAT0"):
    return supply(root, name, type="Battery", capacity=capacity, status=status)


def mains(root: Path, online: bool, name: str = "AC") -> Path:
    return supply(root, name, type="Mains", online="1" if online else "0")


def zone(root: Path, index: int, temp: str) -> Path:
    folder = root / "class" / "thermal" / f"thermal_zone{index}"
    folder.mkdir(parents=True)
    (folder / "temp").write_text(temp + "\n")
    return folder


def reading(on_ac: bool = False, battery_pct: float | None = None, temp_c: float | None = None):
    return DeviceReading(on_ac=on_ac, battery_pct=battery_pct, temp_c=temp_c)


# --- reading the device ---------------------------------------------------------------------


def test_laptop_on_battery(tmp_path: Path) -> None:
    battery(tmp_path, "42", "Discharging")
    mains(tmp_path, online=False)
    zone(tmp_path, 0, "47500")
    assert read_device(tmp_path) == DeviceReading(on_ac=False, battery_pct=42.0, temp_c=47.5)


def test_laptop_on_ac_while_its_battery_discharges(tmp_path: Path) -> None:
    # An online supply wins over a battery status, whatever it says.
    battery(tmp_path, "80", "Discharging")
    mains(tmp_path, online=True)
    got = read_device(tmp_path)
    assert got.on_ac
    assert got.battery_pct == 80.0


def test_any_online_external_supply_is_ac(tmp_path: Path) -> None:
    battery(tmp_path, "30", "Discharging")
    mains(tmp_path, online=False)
    supply(tmp_path, "ucsi-source-psy-USBC000:001", type="USB", online="1")
    assert read_device(tmp_path).on_ac


def test_external_supply_without_online_file_is_not_online(tmp_path: Path) -> None:
    battery(tmp_path, "30", "Charging")
    supply(tmp_path, "AC", type="Mains")
    # An external supply is listed, so the battery's "Charging" does not stand in for it.
    assert not read_device(tmp_path).on_ac


@pytest.mark.parametrize(
    ("status", "on_ac"),
    [("Charging", True), ("Full", True), ("Discharging", False), ("Not charging", False)],
)
def test_phone_with_only_a_battery(tmp_path: Path, status: str, on_ac: bool) -> None:
    battery(tmp_path, "64", status)
    got = read_device(tmp_path)
    assert got.on_ac is on_ac
    assert got.battery_pct == 64.0


def test_no_power_supply_at_all_counts_as_ac(tmp_path: Path) -> None:
    got = read_device(tmp_path)
    assert got == DeviceReading(on_ac=True, battery_pct=None, temp_c=None)


def test_empty_power_supply_class_counts_as_ac(tmp_path: Path) -> None:
    (tmp_path / "class" / "power_supply").mkdir(parents=True)
    assert read_device(tmp_path).on_ac


def test_a_peripherals_battery_is_not_the_devices(tmp_path: Path) -> None:
    supply(tmp_path, "hid-mouse-battery", type="Battery", scope="Device", capacity="5")
    mains(tmp_path, online=False)
    got = read_device(tmp_path)
    assert got.battery_pct is None
    assert not got.on_ac


def test_garbage_capacity_is_skipped(tmp_path: Path) -> None:
    battery(tmp_path, "abc", "Discharging", name="BAT0")
    battery(tmp_path, "70", "Discharging", name="BAT1")
    assert read_device(tmp_path).battery_pct == 70.0


def test_a_battery_without_readable_capacity_still_counts_as_a_battery(tmp_path: Path) -> None:
    (battery(tmp_path, "abc", "Discharging") / "capacity").unlink()
    got = read_device(tmp_path)
    assert got.battery_pct is None
    # A battery is listed and discharging: the device is not on AC.
    assert not got.on_ac


def test_two_batteries_are_averaged(tmp_path: Path) -> None:
    battery(tmp_path, "20", "Discharging", name="BAT0")
    battery(tmp_path, "75", "Discharging", name="BAT1")
    assert read_device(tmp_path).battery_pct == 47.5


def test_the_hottest_zone_counts(tmp_path: Path) -> None:
    zone(tmp_path, 0, "41000")
    zone(tmp_path, 1, "83250")
    zone(tmp_path, 2, "-5000")
    assert read_device(tmp_path).temp_c == 83.25


def test_unreadable_and_absurd_zones_are_skipped(tmp_path: Path) -> None:
    zone(tmp_path, 0, "not a number")
    zone(tmp_path, 1, "-300000")  # below absolute zero
    broken = tmp_path / "class" / "thermal" / "thermal_zone2" / "temp"
    broken.mkdir(parents=True)  # reading it raises IsADirectoryError
    (tmp_path / "class" / "thermal" / "cooling_device0").mkdir()
    (tmp_path / "class" / "thermal" / "cooling_device0" / "temp").write_text("99000\n")
    zone(tmp_path, 3, "55000")
    assert read_device(tmp_path).temp_c == 55.0


def test_no_readable_zone_gives_no_temperature(tmp_path: Path) -> None:
    zone(tmp_path, 0, "")
    assert read_device(tmp_path).temp_c is None


def test_a_supply_whose_type_is_unreadable_is_skipped(tmp_path: Path) -> None:
    weird = supply(tmp_path, "weird", online="1")
    (weird / "type").mkdir()
    battery(tmp_path, "33", "Discharging")
    got = read_device(tmp_path)
    assert not got.on_ac  # the unreadable entry is not taken for an online supply
    assert got.battery_pct == 33.0


def test_undecodable_file_is_skipped(tmp_path: Path) -> None:
    folder = battery(tmp_path, "10", "Discharging", name="BAT0")
    (folder / "capacity").write_bytes(b"\xff\xfe\x00")
    battery(tmp_path, "90", "Discharging", name="BAT1")
    assert read_device(tmp_path).battery_pct == 90.0


# --- the policy ------------------------------------------------------------------------------


def test_a_policy_with_no_rule_is_not_active_and_gives_no_reason() -> None:
    policy = PausePolicy()
    assert not policy.active
    assert policy.reasons(reading(on_ac=False, battery_pct=1.0, temp_c=200.0), 0) == {}


@pytest.mark.parametrize(
    "policy",
    [
        PausePolicy(battery_below=20),
        PausePolicy(above_temp=75),
        PausePolicy(only_on_ac=True),
        PausePolicy(active_hours=(0, 60)),
    ],
)
def test_any_rule_makes_a_policy_active(policy: PausePolicy) -> None:
    assert policy.active


def test_battery_rule_and_its_text() -> None:
    policy = PausePolicy(battery_below=20)
    got = policy.reasons(reading(battery_pct=12.0), 600)
    assert got == {"battery": "on battery at 12% (the policy pauses below 20%)"}
    assert policy.reasons(reading(battery_pct=20.0), 600) == {}


def test_battery_pause_holds_until_hysteresis() -> None:
    assert BATTERY_HYSTERESIS_PCT == 5.0
    policy = PausePolicy(battery_below=20)
    held = frozenset({"battery"})
    assert "battery" in policy.reasons(reading(battery_pct=19.0), 600)
    # Not held, 22% is no reason to pause; held, it is not enough to resume.
    assert "battery" not in policy.reasons(reading(battery_pct=22.0), 600)
    assert "battery" in policy.reasons(reading(battery_pct=22.0), 600, held)
    assert "battery" in policy.reasons(reading(battery_pct=24.9), 600, held)
    assert "battery" not in policy.reasons(reading(battery_pct=25.0), 600, held)


def test_battery_rule_does_not_apply_on_ac() -> None:
    policy = PausePolicy(battery_below=20)
    assert policy.reasons(reading(on_ac=True, battery_pct=3.0), 600) == {}
    assert policy.reasons(reading(on_ac=True, battery_pct=3.0), 600, frozenset({"battery"})) == {}


def test_battery_rule_does_not_apply_without_a_battery() -> None:
    policy = PausePolicy(battery_below=20)
    assert policy.reasons(reading(on_ac=False, battery_pct=None), 600) == {}


def test_temperature_rule_and_its_text() -> None:
    policy = PausePolicy(above_temp=75)
    got = policy.reasons(reading(on_ac=True, temp_c=81.0), 600)
    assert got == {"temperature": "at 81.0 °C (the policy pauses above 75 °C)"}
    assert policy.reasons(reading(on_ac=True, temp_c=75.0), 600) == {}
    assert policy.reasons(reading(on_ac=True, temp_c=None), 600) == {}


def test_temperature_pause_holds_until_hysteresis() -> None:
    assert THERMAL_HYSTERESIS_C == 5.0
    policy = PausePolicy(above_temp=75)
    held = frozenset({"temperature"})
    assert "temperature" in policy.reasons(reading(temp_c=76.0), 600)
    assert "temperature" not in policy.reasons(reading(temp_c=72.0), 600)
    assert "temperature" in policy.reasons(reading(temp_c=72.0), 600, held)
    assert "temperature" in policy.reasons(reading(temp_c=70.1), 600, held)
    assert "temperature" not in policy.reasons(reading(temp_c=70.0), 600, held)


def test_held_keys_of_other_rules_do_not_widen_a_rule() -> None:
    policy = PausePolicy(battery_below=20, above_temp=75)
    held = frozenset({"hand", "ac"})
    assert policy.reasons(reading(battery_pct=22.0, temp_c=72.0), 600, held) == {}


def test_only_on_ac_rule() -> None:
    policy = PausePolicy(only_on_ac=True)
    assert policy.reasons(reading(on_ac=False, battery_pct=99.0), 600) == {
        "ac": "not on AC power (--only-on-ac)"
    }
    assert policy.reasons(reading(on_ac=True), 600) == {}


def test_every_reason_at_once() -> None:
    policy = PausePolicy(battery_below=20, above_temp=75, only_on_ac=True, active_hours=(0, 60))
    got = policy.reasons(reading(on_ac=False, battery_pct=5.0, temp_c=90.0), 120)
    assert set(got) == {"battery", "temperature", "ac", "hours"}


@pytest.mark.parametrize(
    ("clock", "paused"),
    [("23:30", False), ("22:00", False), ("00:00", False), ("05:59", False), ("06:00", True),
     ("12:00", True), ("21:59", True)],
)  # fmt: skip
def test_active_hours_wrapping_midnight(clock: str, paused: bool) -> None:
    policy = PausePolicy(active_hours=parse_hours("22:00-06:00"))
    h, m = map(int, clock.split(":"))
    got = policy.reasons(reading(on_ac=True), h * 60 + m)
    if paused:
        assert got == {"hours": "outside the active hours 22:00-06:00"}
    else:
        assert got == {}


@pytest.mark.parametrize(
    ("clock", "paused"),
    [("08:59", True), ("09:00", False), ("12:00", False), ("17:29", False), ("17:30", True)],
)
def test_active_hours_within_a_day(clock: str, paused: bool) -> None:
    policy = PausePolicy(active_hours=parse_hours("9:00-17:30"))
    h, m = map(int, clock.split(":"))
    assert ("hours" in policy.reasons(reading(on_ac=True), h * 60 + m)) is paused


@pytest.mark.parametrize("minute", [0, 359, 360, 720, 1439])
def test_active_hours_start_equal_end_is_all_day(minute: int) -> None:
    assert PausePolicy(active_hours=(360, 360)).reasons(reading(on_ac=True), minute) == {}


def test_active_hours_to_midnight_as_24_00() -> None:
    policy = PausePolicy(active_hours=parse_hours("18:00-24:00"))
    assert policy.reasons(reading(on_ac=True), 23 * 60 + 59) == {}
    assert "hours" in policy.reasons(reading(on_ac=True), 0)
    assert "hours" in policy.reasons(reading(on_ac=True), 17 * 60 + 59)


# --- hours -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("22:00-06:00", (1320, 360)),
        ("9:00-17:30", (540, 1050)),
        ("22-6", (1320, 360)),
        (" 08:15 - 12:45 ", (495, 765)),
        ("00:00-24:00", (0, 1440)),
        ("7-7", (420, 420)),
    ],
)
def test_parse_hours(text: str, window: tuple[int, int]) -> None:
    assert parse_hours(text) == window


@pytest.mark.parametrize(
    "text",
    ["25:00-01:00", "ab", "10:00", "10:60-11:00", "24:00-06:00", "22:00-24:30", "", "1:5-2:00",
     "10:00-11:00-12:00", "-1:00-02:00"],
)  # fmt: skip
def test_parse_hours_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="active hours") as caught:
        parse_hours(text)
    assert repr(text) in str(caught.value)


def test_format_hours() -> None:
    assert format_hours((1320, 360)) == "22:00-06:00"
    assert format_hours((0, 1440)) == "00:00-24:00"
    assert format_hours((545, 1050)) == "09:05-17:30"


@given(st.integers(0, 24 * 60 - 1), st.integers(0, 24 * 60))
def test_format_then_parse_round_trips(start: int, end: int) -> None:
    assert parse_hours(format_hours((start, end))) == (start, end)


def test_minute_of_day() -> None:
    assert minute_of_day(datetime(2024, 5, 17, 0, 0, 59)) == 0
    assert minute_of_day(datetime(2024, 5, 17, 13, 37)) == 13 * 60 + 37
    assert minute_of_day(datetime(2024, 5, 17, 23, 59, 59)) == 1439
