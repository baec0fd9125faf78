"""Versioned tool contracts: loading, compiling once, linting and compatibility checks."""
