"""Lsn: PostgreSQL's HI/LO text form, int semantics, range checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.lsn import ZERO, Lsn

U64 = st.integers(min_value=0, max_value=Lsn.MAX)


def test_parse_and_format_known_values() -> None:
    assert Lsn.parse("0/16B3748") == 0x16B3748
    assert Lsn.parse("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert str(Lsn(0x16_B374D848)) == "16/B374D848"
    assert str(ZERO) == "0/0"
    assert repr(Lsn(0x2AF96E8)) == "Lsn('0/2AF96E8')"
    assert Lsn.parse("  0/abc ") == 0xABC  # surrounding space tolerated, lower-case hex accepted


@pytest.mark.parametrize(
    "text", ["", "0", "0/", "/1", "1/2/3", "G/0", "123456789/0", "0x1/0", "-1/0"]
)
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse(text)


@pytest.mark.parametrize("value", [-1, Lsn.MAX + 1])
def test_out_of_range(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Lsn(value)


def test_is_an_int() -> None:
    a, b = Lsn.parse("0/10"), Lsn.parse("1/0")
    assert a < b and b - a == (1 << 32) - 0x10
    assert isinstance(a, int) and hash(a) == hash(16) and a == 16
    assert Lsn.parse(str(Lsn(Lsn.MAX))) == Lsn.MAX == 0xFFFFFFFF_FFFFFFFF


@given(U64)
def test_text_round_trip(value: int) -> None:
    lsn = Lsn(value)
    text = str(lsn)
    assert Lsn.parse(text) == value
    hi, lo = text.split("/")
    assert hi == hi.upper() and lo == lo.upper()
    assert int(hi, 16) == value >> 32 and int(lo, 16) == value & 0xFFFFFFFF


@given(U64, U64)
def test_order_matches_int_order(a: int, b: int) -> None:
    assert (Lsn(a) < Lsn(b)) == (a < b)
