"""What a failed replication connection means for the CDC relay's restart loop (one rule).

:func:`give_up_if_unusable`, after a :class:`~cdc_outbox.cdc.replication_stream.ReplicationError`:

- ``auto`` mode: a permanent error, or ``cdc_max_failures`` failed connections in a row, raises
  :class:`CdcUnavailable` (the service falls back to polling);
- otherwise a permanent error for want of the REPLICATION attribute (revoked while running)
  raises :class:`~cdc_outbox.errors.PrivilegeMissing` (exit 5, one line with the fix), any other
  permanent error is raised as is; a transient one returns (the relay retries with back-off).
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from cdc_outbox.cdc.replication_stream import ReplicationError
from cdc_outbox.config.cdc import CdcRelaySection
from cdc_outbox.errors import CdcOutboxError, PrivilegeMissing

__all__ = ["CdcUnavailable", "give_up_if_unusable"]


class CdcUnavailable(CdcOutboxError):
    """Logical replication cannot be used right now (auto mode falls back to polling)."""


def give_up_if_unusable(section: CdcRelaySection, exc: ReplicationError, failures: int) -> None:
    """Raise what ``exc`` means after ``failures`` failed connections in a row (see the
    module rule); return if the relay should retry."""
    if section.auto_mode and (exc.permanent or failures >= section.cdc_max_failures):
        raise CdcUnavailable(str(exc)) from exc
    if exc.permanent and exc.missing_privilege:
        role = conninfo_to_dict(section.dsn).get("user") or "<role>"
        raise PrivilegeMissing(
            f"privileges: role '{role}' lacks REPLICATION ({exc}) (fix: as a superuser:"
            f' ALTER ROLE "{role}" REPLICATION)'
        ) from exc
    if exc.permanent:
        raise exc
