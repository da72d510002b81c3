"""CDC_OUTBOX_PG_VERSION: which PostgreSQL majors the sandbox accepts (pure parsing)."""

from __future__ import annotations

import pytest

from cdc_outbox_dev.sandbox import pg_versions


@pytest.mark.parametrize("value", ["15", "16", "17", "18", " 17 "])
def test_supported_majors_are_accepted(value: str) -> None:
    assert pg_versions.parse_major(value) == value.strip()


@pytest.mark.parametrize("value", ["14", "17.5", "pg17", "19", "latest"])
def test_other_values_are_refused_in_one_line_naming_the_choices(value: str) -> None:
    with pytest.raises(pg_versions.VersionError) as caught:
        pg_versions.parse_major(value)
    message = str(caught.value)
    assert "\n" not in message
    assert repr(value) in message and "15, 16, 17, 18" in message


def test_unset_or_empty_selects_nothing() -> None:
    assert pg_versions.selected_major({}) is None
    assert pg_versions.selected_major({"CDC_OUTBOX_PG_VERSION": " "}) is None
    assert pg_versions.selected_major({"CDC_OUTBOX_PG_VERSION": "18"}) == "18"


def test_every_maven_build_is_of_its_major() -> None:
    assert set(pg_versions.MAVEN_BUILDS) == {"16", "17", "18"}
    for major, version in pg_versions.MAVEN_BUILDS.items():
        assert version.split(".")[0] == major
