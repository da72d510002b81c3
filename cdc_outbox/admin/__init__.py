"""Set-up and inspection: preflight, init/status/drop, DDL, operator actions."""
