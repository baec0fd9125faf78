"""Contract registries and example runs for tests, bounded by the settings' default limits
(the limits are defined once, in `worker.settings`; the schema layer takes them as values)."""

from __future__ import annotations

from pathlib import Path

from worker.compose import violation_limits
from worker.schemas import examples
from worker.schemas.contract import ViolationLimits
from worker.schemas.registry import SchemaRegistry
from worker.schemas.vetting import FASTJSONSCHEMA
from worker.settings import LimitSettings

LIMITS: ViolationLimits = violation_limits(LimitSettings())


def load_registry(directory: Path, engine: str = FASTJSONSCHEMA) -> SchemaRegistry:
    """`SchemaRegistry.load` as `callgate` calls it with default settings."""
    return SchemaRegistry.load(directory, engine, limits=LIMITS)


def run_examples(directory: Path, engine: str) -> examples.ExampleRun:
    """`callgate schemas test` on `directory` with default settings."""
    return examples.run(directory, engine, LIMITS)
