"""The converge core: one engine brought to the desired state (observe → reconcile →
preflight → apply → wait, rolling updates, adapters loaded and replicas put to sleep on the
way)."""
