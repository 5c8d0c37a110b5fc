"""The stack on the engine: observe, reconcile, apply, wait, roll out, status, logs."""
