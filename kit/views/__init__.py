"""Read-only views of a running stack: status, logs, live figures, the ledger's health."""
