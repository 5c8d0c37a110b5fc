"""Reaching a Docker engine and what runs on it: docker-py behind one class, the desired and
the observed state."""
