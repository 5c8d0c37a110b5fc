"""What a spec means on its servers: vLLM flags, GPU pinning, capacity, observability, host
checks."""
