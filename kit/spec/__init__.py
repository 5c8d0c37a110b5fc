"""The operator's site.yaml: its schema, loading with positions, and the checks on the spec
alone."""
