"""debezium_files: reading a connector's .properties file (syntax cases and a round trip)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.debezium.files import parse_properties


def test_properties_syntax() -> None:
    text = (
        "# comment\n! also a comment\n\n"
        "a=1\n  b : two words \nc three\nd\\=e=f\n"
        "long=first \\\n    second\n"
        "esc=tab\\there\\u00e9\\\\\n"
        "empty=\n"
    )
    assert parse_properties(text) == {
        "a": "1", "b": "two words ", "c": "three", "d=e": "f", "long": "first second",
        "esc": "tab\there\u00e9\\", "empty": "",
    }  # fmt: skip


_KEYS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1)
_VALUES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]))


def _escape(text: str, key: bool) -> str:
    out = text.replace("\\", "\\\\")
    if key:
        for ch in " =:#!":
            out = out.replace(ch, "\\" + ch)
    elif out.startswith((" ", "\t")):
        out = "\\" + out
    return out


@given(st.dictionaries(_KEYS, _VALUES, max_size=8))
def test_properties_round_trip(config: dict[str, str]) -> None:
    text = "".join(f"{_escape(k, True)}={_escape(v, False)}\n" for k, v in config.items())
    assert parse_properties(text) == config
