"""Test support: services the tests start for themselves (child processes and what they run)."""
