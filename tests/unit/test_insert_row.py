"""cdc_outbox.pgwire.insert_row: the compiled per-event decode (its agreement with the checked
decoder, on both builds, is in test_pgoutput.py)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.pgwire import insert_row
from cdc_outbox.pgwire.insert_row import text_row

Column = bytes | None | str  # str: a column kind the fast path does not take ('u', 'b')


def _insert(oid: int, columns: Sequence[Column]) -> bytes:
    out = [b"I", struct.pack("!IcH", oid, b"N", len(columns))]
    for c in columns:
        if c is None:
            out.append(b"n")
        elif isinstance(c, str):
            out.append(b"u" if c == "u" else b"b" + struct.pack("!I", 1) + b"x")
        else:
            out.append(b"t" + struct.pack("!I", len(c)) + c)
    return b"".join(out)


column = st.one_of(st.binary(max_size=40), st.none(), st.sampled_from(["u", "b"]))


@given(st.integers(0, 2**32 - 1), st.lists(column, max_size=16))
def test_takes_exactly_the_rows_of_text_and_nulls(oid: int, columns: list[Column]) -> None:
    got = text_row(_insert(oid, columns))
    if any(isinstance(c, str) for c in columns):
        assert got is None
    else:
        assert got == (oid, tuple(columns))


@given(st.lists(st.binary(max_size=20) | st.none(), max_size=6), st.data())
def test_a_cut_or_grown_row_is_not_taken(columns: list[bytes | None], data: st.DataObject) -> None:
    raw = _insert(7, columns)
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=4))
    assert text_row(raw) is None


def test_other_messages_are_not_taken() -> None:
    row = _insert(1, [b"a"])
    assert text_row(b"U" + row[1:]) is None  # not an Insert
    assert text_row(row[:5] + b"K" + row[6:]) is None  # not a new tuple
    assert text_row(b"") is None


def test_compiled_from_the_current_source() -> None:
    """The README's install builds the extension (setup.py; scripts/bootstrap.sh installs
    gcc for it); an edit of the source after that is not seen until the reinstall (the
    extension shadows the source)."""
    assert insert_row.COMPILED, (
        "cdc_outbox.pgwire.insert_row is not compiled: reinstall (scripts/bootstrap.sh or"
        " pip install -e '.[dev]') and read the build's warning"
    )
    source = Path(insert_row.__file__).with_name("insert_row.py")
    assert Path(insert_row.__file__).stat().st_mtime >= source.stat().st_mtime, (
        f"{insert_row.__file__} is older than {source}: reinstall (pip install -e '.[dev]')"
    )
