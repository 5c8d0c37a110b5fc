"""The operator's site.yaml: its schema, loading with positions, and the checks on the spec
itself (what it names on the host: kit/plan/host.py)."""
