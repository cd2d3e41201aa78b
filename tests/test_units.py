"""Byte sizes: parse_bytes and fmt_bytes."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron.units import fmt_bytes, parse_bytes


@pytest.mark.parametrize("text,value", [
    ("4096", 4096),
    ("1", 1),
    ("12GiB", 12 * 2 ** 30),
    ("12GB", 12 * 10 ** 9),
    ("12gib", 12 * 2 ** 30),
    ("12 GiB", 12 * 2 ** 30),
    (" 512MiB ", 512 * 2 ** 20),
    ("512MB", 512 * 10 ** 6),
    ("1.5KiB", 1536),
    ("0.5KiB", 512),
    ("1e9", 10 ** 9),
    ("2E3", 2000),
    ("1K", 1000),
    ("3M", 3 * 10 ** 6),
    ("2G", 2 * 10 ** 9),
    ("1TiB", 2 ** 40),
    ("2TB", 2 * 10 ** 12),
    ("100B", 100),
    ("64KiB", 65536),
    (".5MiB", 2 ** 19),
    (4096, 4096),
])
def test_parse_bytes(text, value):
    got = parse_bytes(text)
    assert got == value
    assert type(got) is int


@pytest.mark.parametrize("text", ["12XB", "", "GiB", "-5", "-1GiB", "0", "0B", "0.1", "abc",
                                  "1 2", "1..5GiB", "12GiBs", "nan", "inf", "1,5GiB", 0, -3])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError) as ei:
        parse_bytes(text)
    if isinstance(text, str) and text:
        assert repr(text) in str(ei.value) or str(text) in str(ei.value)


def test_parse_bytes_error_lists_units():
    with pytest.raises(ValueError, match="GiB"):
        parse_bytes("12XB")


@pytest.mark.parametrize("n,text", [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (2 ** 20 - 1, "1024.0 KiB"),
    (2 ** 20, "1.0 MiB"),
    (512 * 2 ** 20, "512.0 MiB"),
    (2 ** 30, "1.00 GiB"),
    (12 * 2 ** 30, "12.00 GiB"),
    (12 * 10 ** 9, "11.18 GiB"),
    (3 * 2 ** 40, "3072.00 GiB"),
])
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


@given(st.integers(min_value=1, max_value=2 ** 53))
def test_parse_plain_integers(n):
    assert parse_bytes(str(n)) == n
    assert parse_bytes(n) == n


def test_parse_large_integer_strings_exactly():
    assert parse_bytes("9007199254740993") == 9007199254740993
    assert parse_bytes(f"{2 ** 53 + 1}B") == 2 ** 53 + 1


@given(st.integers(min_value=1, max_value=2 ** 20),
       st.sampled_from([("KiB", 2 ** 10), ("MiB", 2 ** 20), ("GiB", 2 ** 30), ("KB", 10 ** 3),
                        ("MB", 10 ** 6), ("GB", 10 ** 9), ("B", 1)]))
def test_parse_with_units(n, unit):
    suffix, mult = unit
    assert parse_bytes(f"{n}{suffix}") == n * mult
    assert parse_bytes(f"{n} {suffix.lower()}") == n * mult


@given(st.integers(min_value=0, max_value=2 ** 50))
def test_fmt_round_trips_approximately(n):
    s = fmt_bytes(n)
    number, unit = s.split()
    assert unit in ("B", "KiB", "MiB", "GiB")
    if n:
        back = parse_bytes(number + unit)
        # printed with 1 decimal (KiB, MiB) or 2 (GiB): within half a unit of the last digit
        tol = {"B": 0, "KiB": 0.05 * 2 ** 10, "MiB": 0.05 * 2 ** 20, "GiB": 0.005 * 2 ** 30}[unit]
        assert abs(back - n) <= tol + 1
