"""A site's stack as a whole: kit up, kit down, kit probe, kit adapters (supply, the converge
core and the worker nodes composed)."""
