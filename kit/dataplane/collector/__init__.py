"""The usage ledger's collector (usage_ledger.py), run in the usage-ledger container."""
