"""`python -m cdc_outbox_dev` runs the dev CLI (sandbox, demo)."""

from cdc_outbox_dev.cli import main

if __name__ == "__main__":
    main()
