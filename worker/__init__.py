"""callgate: the gate every model tool call passes before anything executes it."""

__version__ = "0.1.0"
