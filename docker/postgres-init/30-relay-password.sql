-- Demo only: the least-privilege relay role (sql/roles.sql) gets a password the relays use.
ALTER ROLE cdc_outbox PASSWORD 'relay';
