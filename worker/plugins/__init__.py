"""Plugins: business rules per tool and version adapters per (schema id, version).

A plugin is a module with `register(plugins: Plugins) -> None`; the settings name the modules by
import path, and `load_plugins` imports them once at start-up. A rule returns the violations it
finds (an empty iterable when the arguments pass); a rule that raises is the chain's `rule_error`,
never a crash. An adapter returns the arguments in the current internal shape.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import ConfigError
from worker.model import SchemaRef, Violation


@dataclass(frozen=True, slots=True)
class RuleContext:
    schema: SchemaRef
    idempotency_key: str | None


Rule = Callable[[Mapping[str, Any], RuleContext], Iterable[Violation]]
Adapter = Callable[[Mapping[str, Any]], dict[str, Any]]


class Plugins:
    def __init__(self) -> None:
        self._rules: dict[str, list[Rule]] = {}
        self._adapters: dict[tuple[str, str], Adapter] = {}

    def rule(self, schema_id: str) -> Callable[[Rule], Rule]:
        """Decorator: run this rule on every schema-valid call of `schema_id`."""

        def add(rule: Rule) -> Rule:
            self._rules.setdefault(schema_id, []).append(rule)
            return rule

        return add

    def adapter(self, schema_id: str, version: str) -> Callable[[Adapter], Adapter]:
        """Decorator: turn arguments of this schema version into the internal shape."""

        def add(adapter: Adapter) -> Adapter:
            if (schema_id, version) in self._adapters:
                raise ConfigError(f"two adapters registered for {schema_id} v{version}")
            self._adapters[(schema_id, version)] = adapter
            return adapter

        return add

    def rules_for(self, schema_id: str) -> tuple[Rule, ...]:
        return tuple(self._rules.get(schema_id, ()))

    def adapter_for(self, ref: SchemaRef) -> Adapter | None:
        return self._adapters.get((ref.id, ref.version))


def load_plugins(modules: Iterable[str]) -> Plugins:
    plugins = Plugins()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugin module {name!r} cannot be imported: {exc}") from exc
        register = getattr(module, "register", None)
        if not callable(register):
            raise ConfigError(f"plugin module {name!r} has no register(plugins) function")
        register(plugins)
    return plugins
