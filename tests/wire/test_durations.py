"""parse_duration: seconds or <number><unit>, refused loudly with the field named."""

from __future__ import annotations

import math

import pytest

from fleetserve.wire import InvalidInput, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("2.5", 2.5),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("24h", 86400.0),
        (" 10 s ", 10.0),
        (".5s", 0.5),
        ("1e3ms", 1.0),
        ("0", 0.0),
    ],
)
def test_accepts_seconds_and_units(value: object, seconds: float) -> None:
    got = parse_duration(value, "keep_alive")
    assert isinstance(got, float) and math.isclose(got, seconds)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (-1, "must not be negative"),
        ("-5s", "must not be negative"),
        (90000, "enormous"),
        ("25h", "enormous"),
        (10**400, "finite"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("inf", "finite"),
        ("nan", "finite"),
        (True, "number of seconds"),
        (False, "number of seconds"),
        (None, "number of seconds"),
        ([1], "number of seconds"),
        ("", "number of seconds"),
        ("soon", "number of seconds"),
        ("5 minutes", "number of seconds"),
        ("30d", "number of seconds"),
        ("1h30m", "number of seconds"),
        ("5M", "number of seconds"),
    ],
)
def test_refuses_with_the_field_and_the_form(value: object, match: str) -> None:
    with pytest.raises(InvalidInput, match=match) as info:
        parse_duration(value, "keep_alive")
    assert info.value.field == "keep_alive"
    assert info.value.message.startswith("keep_alive ")
    assert "\n" not in info.value.message


def test_maximum_is_a_parameter() -> None:
    assert parse_duration("2h", "ttl", maximum=7200) == 7200.0
    with pytest.raises(InvalidInput, match="enormous") as info:
        parse_duration("2h", "ttl", maximum=3600)
    assert info.value.field == "ttl" and "3600" in info.value.message
    with pytest.raises(InvalidInput, match="250ms, 30s, 5m, 1h"):
        parse_duration("later", "ttl")
