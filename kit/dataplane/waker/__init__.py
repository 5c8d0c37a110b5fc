"""The waker of sleeping models (waker.py), run in the waker container (docs/sleep.md)."""
