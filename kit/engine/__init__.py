"""Reaching a Docker engine and what runs on it: docker-py behind one class, desired and observed
state."""
