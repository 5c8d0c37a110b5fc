"""What a spec means on its servers: vLLM flags, GPU pinning, capacity,
observability, and the checks of what the spec names on this host."""
