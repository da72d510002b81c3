"""The outbox database as a component connecting to it sees it (the section of
:class:`~cdc_outbox.config.settings.Settings` that the connection pool and the dedicated
connections read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdc_outbox.config.settings import Settings

__all__ = ["DatabaseSection", "database_section"]


@dataclass(frozen=True, slots=True)
class DatabaseSection:
    """The conninfo (never printed: left out of ``repr``), the pool's size and the secrets to
    mask in error text. Answers the same three questions as ``Settings``
    (:meth:`postgres_dsn`, :attr:`db_pool_max_size`, :meth:`secret_values`), so the pool
    (:mod:`cdc_outbox.store.db_pool`) lends connections for either."""

    dsn: str = field(repr=False)
    db_pool_max_size: int = 4
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def postgres_dsn(self) -> str:
        """The real conninfo string / URI, for psycopg. Never log it."""
        return self.dsn

    def secret_values(self) -> list[str]:
        """Every secret string of the settings (for scrubbing error text and logs)."""
        return list(self.secrets)


def database_section(settings: Settings) -> DatabaseSection:
    """The :class:`DatabaseSection` of ``settings``."""
    return DatabaseSection(
        settings.postgres_dsn(), settings.db_pool_max_size, tuple(settings.secret_values())
    )
