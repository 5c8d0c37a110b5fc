"""The front door's request counter (door_figures.py, door-figures.py in its container)."""
