-- cdc-outbox: a least-privilege role for `cdc-outbox run` (default preset, public.outbox).
--
-- Who runs what:
--   * `cdc-outbox init` creates the publication, which PostgreSQL only allows to the table
--     owner (or a superuser), plus the replication slot (needs REPLICATION). Run `init` as
--     the table owner (give it REPLICATION too) or as a superuser.
--   * `cdc-outbox run` / `status` need only this role.
-- Run this script as a superuser (granting REPLICATION needs one) after the outbox table exists.
-- pg_hba.conf must let the role connect to the outbox's database. Logical replication
-- connections (replication=database) match pg_hba's *database* column like ordinary
-- ones; the `replication` keyword there is for physical replication only.

-- LOGIN: the relay connects. REPLICATION: open a walsender connection and stream
-- the logical slot. No password here: set one with \password cdc_outbox (psql).
CREATE ROLE cdc_outbox WITH LOGIN REPLICATION;

-- Reach objects in the outbox's schema.
GRANT USAGE ON SCHEMA public TO cdc_outbox;

-- Read outbox rows: the polling relay claims and reads them, `status` counts them.
GRANT SELECT ON public.outbox TO cdc_outbox;

-- The polling relay leases, retries and marks rows; it may change these columns only
-- (never the event itself).
GRANT UPDATE (status, attempts, available_at, locked_at, locked_by, published_at, last_error)
    ON public.outbox TO cdc_outbox;

-- Cleanup of published rows (retention).
GRANT DELETE ON public.outbox TO cdc_outbox;

-- The relay's durable phase and the leader lease of the single active instance.
GRANT SELECT, INSERT, UPDATE ON public.cdc_outbox_relay_state TO cdc_outbox;

-- Deliberately NOT granted: INSERT on the outbox (only the application writes events;
-- `cdc-outbox redrive` re-inserts dead letters and is run by the table owner), TRUNCATE,
-- ownership, CREATE on the database or schema.
