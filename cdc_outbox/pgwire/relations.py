"""Relation messages seen on one replication connection, by OID (pure, no I/O).

A change message names its table by OID only; :class:`RelationCache` resolves it to the last
:class:`~cdc_outbox.pgwire.pgoutput_messages.Relation` received, and raises
:class:`UnknownRelationError` (a :class:`~cdc_outbox.errors.DecodeError`) for an OID with none.
Both are re-exported by :mod:`cdc_outbox.pgwire.pgoutput`.
"""

from __future__ import annotations

from cdc_outbox.errors import DecodeError
from cdc_outbox.pgwire.pgoutput_messages import Relation

__all__ = ["RelationCache", "UnknownRelationError"]


class UnknownRelationError(DecodeError, KeyError):
    """A change refers to a relation OID with no Relation message since (re)connect."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RelationCache:
    """Relation messages by OID; a newer Relation for an OID replaces the older one.

    Clear on reconnect: the server re-sends every Relation before its first use.
    """

    __slots__ = ("_by_oid",)

    def __init__(self) -> None:
        self._by_oid: dict[int, Relation] = {}

    def put(self, rel: Relation) -> None:
        self._by_oid[rel.oid] = rel

    def get(self, oid: int) -> Relation:
        try:
            return self._by_oid[oid]
        except KeyError:
            raise UnknownRelationError(f"no Relation message for relation OID {oid}") from None

    def clear(self) -> None:
        self._by_oid.clear()

    def __len__(self) -> int:
        return len(self._by_oid)

    def __contains__(self, oid: object) -> bool:
        return oid in self._by_oid
