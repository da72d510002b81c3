"""`python -m cdc_outbox` runs the CLI."""

from cdc_outbox.cli import main

if __name__ == "__main__":
    main()
