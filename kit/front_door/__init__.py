"""The running nginx: reload, the HTTP client and the gate through it, ACME, credential changes."""
