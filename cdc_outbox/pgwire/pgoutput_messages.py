"""pgoutput message types: the dataclasses :func:`cdc_outbox.pgwire.pgoutput.decode` returns.

LSNs, xids and timestamps are plain ``int`` (timestamps: µs since 2000-01-01 UTC). Column
values stay raw ``bytes``, ``None`` for SQL NULL, :data:`UNCHANGED_TOAST` for an unchanged
TOASTed value that the server did not send. Message objects are slots dataclasses: treat as
immutable. Import them from :mod:`cdc_outbox.pgwire.pgoutput`, which re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias, final

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "ColumnValue",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "StreamableMessage",
    "Streamed",
    "Truncate",
    "TupleData",
    "Type",
    "UnchangedToast",
    "Update",
]


@final
class UnchangedToast:
    """Type of :data:`UNCHANGED_TOAST`: a TOASTed value that did not change and was not sent."""

    __slots__ = ()
    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast()

ColumnValue: TypeAlias = bytes | UnchangedToast | None
TupleData: TypeAlias = tuple[ColumnValue, ...]


@dataclass(slots=True)
class Begin:
    final_lsn: int
    commit_time: int
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(slots=True)
class RelationColumn:
    flags: int  # 1 = part of the replica identity key
    name: str
    type_oid: int
    type_modifier: int


@dataclass(slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(slots=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(slots=True)
class Update:
    relation_oid: int
    old: TupleData | None  # 'O': whole old row (REPLICA IDENTITY FULL)
    key: TupleData | None  # 'K': old key columns (key changed); other columns None
    new: TupleData


@dataclass(slots=True)
class Delete:
    relation_oid: int
    old: TupleData | None
    key: TupleData | None


@dataclass(slots=True)
class Truncate:
    options: int  # bit 1 = CASCADE, bit 2 = RESTART IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(slots=True)
class StreamAbort:
    """Aborts ``subxid`` (== ``xid`` for the whole transaction); LSN/time only in v4+."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_time: int | None = None


StreamableMessage: TypeAlias = Relation | Type | Insert | Update | Delete | Truncate | Message


@dataclass(slots=True)
class Streamed:
    """A change inside a stream block (``decode(..., in_stream=True)``), with its (sub)xid."""

    xid: int
    message: StreamableMessage


PgOutputMessage: TypeAlias = (
    Begin | Commit | Origin | StreamableMessage | StreamStart | StreamStop | StreamCommit
    | StreamAbort | Streamed
)  # fmt: skip
