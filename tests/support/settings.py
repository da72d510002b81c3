"""Settings helpers shared by the settings tests."""

from __future__ import annotations

import pytest

from cdc_outbox.config.settings import load_settings
from cdc_outbox.errors import ConfigError


def config_error(**kwargs: object) -> str:
    """The one-line ``ConfigError`` message ``load_settings(**kwargs)`` raises."""
    with pytest.raises(ConfigError) as info:
        load_settings(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("config: ")
    return message
