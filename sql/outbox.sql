-- cdc-outbox: the outbox table, default column preset.
-- Equivalent to `cdc-outbox init --create-table` with default settings
-- (schema "public", table "outbox"). Run as the role that will own the table.

CREATE TABLE IF NOT EXISTS public.outbox (
    -- Event columns: written by the application, read by the relay.
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),  -- event id, for consumer de-duplication
    aggregate_type  text        NOT NULL,                               -- picks the topic: outbox.event.<aggregate_type>
    aggregate_id    text        NOT NULL,                               -- Kafka message key (per-aggregate ordering)
    event_type      text        NOT NULL,                               -- sent as a header
    payload         jsonb,                                              -- Kafka message value (NULL: dead-lettered, or a tombstone with null_payload = "tombstone")
    headers         jsonb       NOT NULL DEFAULT '{}',                  -- extra Kafka headers (string values)
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),     -- increases within a transaction: orders events

    -- Polling-relay columns (fallback mode). In replication mode the relay only marks
    -- acknowledged rows PUBLISHED (setting cdc_mark_published).
    status          text        NOT NULL DEFAULT 'PENDING'
                                CHECK (status IN ('PENDING', 'PROCESSING', 'PUBLISHED', 'FAILED')),
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),                 -- next attempt not before
    locked_at       timestamptz,                                        -- lease start (PROCESSING)
    locked_by       text,                                               -- relay instance holding the lease
    published_at    timestamptz,
    last_error      text
);

-- Polling claims the oldest due PENDING rows; this index keeps that cheap.
CREATE INDEX IF NOT EXISTS outbox_pending_idx
    ON public.outbox (available_at)
    WHERE status = 'PENDING';

-- Polling keeps each aggregate in order by looking at its unpublished rows; this index
-- finds them without scanning the table.
CREATE INDEX IF NOT EXISTS outbox_unpublished_idx
    ON public.outbox (aggregate_id, created_at)
    WHERE status IN ('PENDING', 'PROCESSING');

-- Dead letters park their aggregate: every mode looks up the FAILED rows per aggregate.
CREATE INDEX IF NOT EXISTS outbox_failed_idx
    ON public.outbox (aggregate_id, created_at)
    WHERE status = 'FAILED';

-- The relay's durable phase and leader lease (one row per slot; `cdc-outbox init` creates it).
CREATE TABLE IF NOT EXISTS public.cdc_outbox_relay_state (
    slot_name        text        PRIMARY KEY,
    phase            text        NOT NULL DEFAULT 'CATCHING_UP'
                                 CHECK (phase IN ('POLLING', 'CATCHING_UP', 'STREAMING')),
    consistent_point pg_lsn,                                            -- of the slot being caught up / streamed
    leader_id        text,                                              -- instance holding the lease
    leader_pid       integer,                                           -- its lock connection's backend
    lease_until      timestamptz,
    confirmed_lsn    pg_lsn,                                            -- confirmed to the slot: all before it is in Kafka
    streamed_tables  jsonb,                                             -- outbox tables the slot streams, each from an LSN
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- A table made by an older `init` lacks confirmed_lsn (the relay then cannot keep it).
ALTER TABLE public.cdc_outbox_relay_state ADD COLUMN IF NOT EXISTS confirmed_lsn pg_lsn;
ALTER TABLE public.cdc_outbox_relay_state ADD COLUMN IF NOT EXISTS streamed_tables jsonb;

-- `cdc-outbox init` then creates the publication (and the replication slot):
--   CREATE PUBLICATION cdc_outbox_pub FOR TABLE public.outbox
--       WITH (publish = 'insert', publish_via_partition_root = true);
-- A partitioned outbox works too (e.g. PARTITION BY RANGE (created_at), primary key
-- (id, created_at), the two indexes above created on the partitioned table): with
-- publish_via_partition_root its partitions' inserts are streamed as rows of public.outbox.
