"""kit wake: wake a sleeping service now (every replica), through the engine."""

from kit.commands.sleep import sleep_verb

wake = sleep_verb("wake")
