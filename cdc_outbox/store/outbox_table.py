"""One outbox table: its layout, the rules of its rows, and the statements other layers need
on it. The one place that answers "does this layout keep row states?", "which rows are
unpublished?" and "what is dead-lettered?" (issue 35: ``store/`` owns the outbox row); built per
outbox, so several outbox tables can each have their own.

Row states, for a layout with status columns (the default preset): ``PENDING`` (written by the
application) -> ``PROCESSING`` (claimed by a polling worker) -> ``PUBLISHED`` (or deleted, with
``cdc_mark_published = "delete"``); ``FAILED`` is a dead letter, which parks the later events of
its aggregate until ``redrive``. *Unpublished* means ``PENDING`` or ``PROCESSING``. A layout
without status columns (the Debezium preset) keeps no states: every row still in the table is
unpublished as far as a catch-up can tell.

Statements are ``psycopg.sql`` compositions; names only go through ``sql.Identifier``.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from cdc_outbox.config.columns import ColumnNames
from cdc_outbox.config.settings import OutboxSettings, Settings

__all__ = ["STATUSES", "UNPUBLISHED_STATES", "OutboxTable"]

#: Every row state, in the order a row goes through them (FAILED: dead-lettered).
STATUSES = ("PENDING", "PROCESSING", "PUBLISHED", "FAILED")
#: The states of a row not yet in Kafka.
UNPUBLISHED_STATES = ("PENDING", "PROCESSING")

_STATUS = sql.Identifier("status")


def _in(states: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("{} IN ({})").format(_STATUS, sql.SQL(", ").join(map(sql.Literal, states)))


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """The layout of one outbox table and every rule about its rows (see the module doc)."""

    schema: str
    table: str
    columns: ColumnNames
    #: The layout has the status columns (status, attempts, available_at, ...).
    has_status: bool
    #: ``cdc_mark_published``: what the CDC relay does to a row once Kafka has it.
    marking: str = "update"
    #: ``columns.sequence``: a column growing per aggregate in commit order, if configured.
    sequence: str | None = None

    @classmethod
    def of(cls, settings: Settings, outbox: OutboxSettings | None = None) -> OutboxTable:
        """The outbox table ``outbox`` of ``settings`` (None: the first configured)."""
        o = outbox or settings.outbox()
        return cls(
            schema=o.schema_name,
            table=o.table,
            columns=settings.column_names(o),
            has_status=o.columns.has_status,
            marking=o.cdc_mark_published,
            sequence=o.columns.sequence,
        )

    @classmethod
    def all_of(cls, settings: Settings) -> tuple[OutboxTable, ...]:
        """Every outbox table ``settings`` configure, in configuration order."""
        return tuple(cls.of(settings, o) for o in settings.outbox_settings())

    @property
    def ident(self) -> sql.Identifier:
        """``schema.table``."""
        return sql.Identifier(self.schema, self.table)

    @property
    def name(self) -> str:
        """``schema.table`` as text, for messages and labels."""
        return f"{self.schema}.{self.table}"

    @property
    def order_column(self) -> str | None:
        """The column that orders an aggregate's rows in commit order: ``columns.sequence``,
        else the status layout's ``created_at`` (``clock_timestamp()`` at insert), else none."""
        if self.sequence is not None:
            return self.sequence
        return "created_at" if self.has_status else None

    @property
    def keeps_published_rows(self) -> bool:
        """Published rows stay in the table and can be told from unpublished ones."""
        return self.has_status and self.marking != "delete"

    @staticmethod
    def is_dead_letter(status: object) -> bool:
        """A row in ``status`` (as a statement returned it; None for a layout without status
        columns) is dead-lettered (FAILED)."""
        return status == "FAILED"

    # -- predicates ---------------------------------------------------------------------------

    def unpublished(self) -> sql.Composable:
        """Rows not yet in Kafka: PENDING or PROCESSING; every row without status columns."""
        return _in(UNPUBLISHED_STATES) if self.has_status else sql.SQL("true")

    def failed(self) -> sql.Composed:
        """Dead-lettered rows (status columns only)."""
        self._need_status("dead letters")
        return sql.SQL("{} = 'FAILED'").format(_STATUS)

    def published(self) -> sql.Composed:
        """Rows marked PUBLISHED (status columns only)."""
        self._need_status("published rows")
        return sql.SQL("{} = 'PUBLISHED'").format(_STATUS)

    # -- statements ---------------------------------------------------------------------------

    def count_unpublished(self) -> sql.Composed:
        """``SELECT count(*)`` of the rows a catch-up would publish."""
        return sql.SQL("SELECT count(*) FROM {} WHERE {}").format(self.ident, self.unpublished())

    def status_counts(self) -> sql.Composed:
        """``SELECT`` the unpublished rows, the oldest one's age in seconds (by ``created_at``;
        0 when there is none), the PENDING rows, the dead-lettered rows and the aggregates
        they park: what ``status``, ``lag`` and the per-table gauges show."""
        self._need_status("status counts")
        unpublished = self.unpublished()
        return sql.SQL(
            "SELECT count(*) FILTER (WHERE {u}),"
            " coalesce(extract(epoch FROM now() - min({c}) FILTER (WHERE {u})), 0)::float8,"
            " count(*) FILTER (WHERE {s} = 'PENDING'), count(*) FILTER (WHERE {f}),"
            " count(DISTINCT {agg}) FILTER (WHERE {f}) FROM {t} WHERE {u} OR {f}"
        ).format(
            u=unpublished,
            c=sql.Identifier("created_at"),
            s=_STATUS,
            f=self.failed(),
            agg=sql.Identifier(self.columns.aggregate_id),
            t=self.ident,
        )

    def polling_counts(self, *, with_age: bool) -> sql.Composed:
        """``SELECT`` PENDING, PROCESSING and FAILED rows, the retrying PENDING rows and their
        attempts, and (``with_age``: a ``created_at`` column) the oldest unpublished row's age
        in seconds (else NULL)."""
        self._need_status("polling counts")
        age: sql.Composable = sql.SQL("NULL::float8")
        if with_age:
            age = sql.SQL("extract(epoch FROM now() - min({}) FILTER (WHERE {}))::float8").format(
                sql.Identifier("created_at"), _in(UNPUBLISHED_STATES)
            )
        attempts = sql.Identifier("attempts")
        return sql.SQL(
            "SELECT count(*) FILTER (WHERE {s} = 'PENDING'),"
            " count(*) FILTER (WHERE {s} = 'PROCESSING'),"
            " count(*) FILTER (WHERE {s} = 'FAILED'),"
            " count(*) FILTER (WHERE {s} = 'PENDING' AND {a} > 0),"
            " coalesce(sum({a}) FILTER (WHERE {s} = 'PENDING' AND {a} > 0), 0)::bigint,"
            " {age} FROM {t} WHERE {active}"
        ).format(
            s=_STATUS,
            a=attempts,
            age=age,
            t=self.ident,
            active=_in((*UNPUBLISHED_STATES, "FAILED")),
        )

    def _need_status(self, what: str) -> None:
        if not self.has_status:
            raise ValueError(f"{self.name}: {what} need the status columns of the default layout")
