"""Plugins: business rules and authorizers per tool, version adapters per (schema id, version).

Plugins belong to the contracts they extend: a contracts directory may hold a `plugins.py`
beside its schemas, and only that directory's contracts get its rules and adapters (another
directory with a schema of the same id gets none). The settings may name more plugin modules by
import path. A plugin module has `register(plugins: Plugins) -> None`.

A rule returns the violations it finds (an empty iterable when the arguments pass); a rule that
raises is the chain's `rule_error`, never a crash. An adapter returns the arguments in the current
internal shape; one that raises is `adapter_error`.

An authorizer decides whether the call's principal may make this call: `True` lets it through,
`False` refuses it (`unauthorized`, phase `authorization`, not retryable; the model is told only
that the call is not permitted). It runs after the business rules and the contract's
`allowed_principals` (a call refused by the list reaches no authorizer); the principal is None
when the call named none. One that raises, or returns anything but a bool, is
`authorizer_error`: refused too, never a crash.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from worker.errors import ConfigError
from worker.model import SchemaRef, Violation

#: The file of a contracts directory that holds its plugins.
CONTRACT_PLUGINS = "plugins.py"


@dataclass(frozen=True, slots=True)
class RuleContext:
    schema: SchemaRef
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class AuthorizationContext:
    """What an authorizer knows of a call besides its arguments."""

    schema: SchemaRef
    tool: str
    #: who the call is made for, as its records named it (None: they named nobody)
    principal: str | None
    idempotency_key: str | None


Rule = Callable[[Mapping[str, Any], RuleContext], Iterable[Violation]]
Adapter = Callable[[Mapping[str, Any]], dict[str, Any]]
Authorizer = Callable[[Mapping[str, Any], AuthorizationContext], bool]


class Plugins:
    def __init__(self) -> None:
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self._adapters: dict[tuple[str, str], Adapter] = {}
        self._authorizers: dict[str, tuple[Authorizer, ...]] = {}

    def rule(self, schema_id: str) -> Callable[[Rule], Rule]:
        """Decorator: run this rule on every schema-valid call of `schema_id`."""

        def add(rule: Rule) -> Rule:
            self._rules[schema_id] = (*self._rules.get(schema_id, ()), rule)
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

    def authorizer(self, schema_id: str) -> Callable[[Authorizer], Authorizer]:
        """Decorator: ask this authorizer whether the principal may make each call of
        `schema_id` (every authorizer of a tool must allow it)."""

        def add(authorizer: Authorizer) -> Authorizer:
            self._authorizers[schema_id] = (*self._authorizers.get(schema_id, ()), authorizer)
            return authorizer

        return add

    def authorizers_for(self, schema_id: str) -> tuple[Authorizer, ...]:
        return self._authorizers.get(schema_id, ())

    def rules_for(self, schema_id: str) -> tuple[Rule, ...]:
        return self._rules.get(schema_id, ())

    def adapter_for(self, ref: SchemaRef) -> Adapter | None:
        return self._adapters.get((ref.id, ref.version))


def load_plugins(contracts: Path | None = None, modules: Iterable[str] = ()) -> Plugins:
    """The plugins of a contracts directory (its `plugins.py`, if any) and of named modules."""
    plugins = Plugins()
    if contracts is not None and (contracts / CONTRACT_PLUGINS).is_file():
        _register(
            _from_file(contracts / CONTRACT_PLUGINS), str(contracts / CONTRACT_PLUGINS), plugins
        )
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugin module {name!r} cannot be imported: {exc}") from exc
        _register(module, name, plugins)
    return plugins


def _from_file(path: Path) -> ModuleType:
    # a name of its own per file, so two contracts directories never share a module
    digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    spec = importlib.util.spec_from_file_location(f"callgate_contracts_{digest}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugins file {path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the file is the contract author's code: say what broke
        raise ConfigError(f"plugins file {path} failed to load: {exc!r}") from exc
    return module


def _register(module: ModuleType, name: str, plugins: Plugins) -> None:
    register = getattr(module, "register", None)
    if not callable(register):
        raise ConfigError(f"plugin module {name!r} has no register(plugins) function")
    register(plugins)
