"""kit: one site.yaml per GPU server -> a secured, verified vLLM endpoint."""

__version__ = "0.1.0"
