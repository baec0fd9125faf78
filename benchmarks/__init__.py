"""callgate's benchmarks: every figure a ratio against a baseline measured in the same run.

Run with `python -m benchmarks [name]`; results land in benchmarks/results/, summarised in
benchmarks/README.md.
"""
