"""JSON-Schema-Test-Suite (draft 7 and 2020-12, required tests) through the registry, per engine.

The rule under test: a group's schema is refused at load, or every test in it gets the expected
verdict. Nothing invalid is ever silently accepted, and nothing is ever fetched. And every
invalid instance is explained: its bounded violations are among the ones jsonschema-rs reports
when asked for all of them (the suite's instances are small enough to ask), never the generic
"does not match the schema".
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.datafiles import data_files, data_path
from tests.support.contracts import load_registry
from worker.errors import SchemaLoadError
from worker.schemas.contract import Contract
from worker.schemas.drafts import Draft, pointer
from worker.schemas.engines import rust_patterns
from worker.schemas.report import rs_findings, rs_validator

SUITE = data_path("json-schema-test-suite")
DRAFT7_URI = "http://json-schema.org/draft-07/schema#"


@dataclass
class Tally:
    engine: str
    draft: str
    accepted_groups: int = 0
    refused_groups: int = 0
    tests_run: int = 0
    refused_by_file: dict[str, int] = field(default_factory=dict)
    #: (file, group, test, expected valid) for every wrong verdict
    wrong: list[tuple[str, str, str, bool]] = field(default_factory=list)
    #: (file, group, test, violations) for an invalid instance not explained as it should be
    unexplained: list[tuple[str, str, str, Any]] = field(default_factory=list)

    @property
    def silent_acceptances(self) -> int:
        return sum(1 for *_, valid in self.wrong if not valid)


def groups(draft: str) -> list[tuple[str, dict[str, Any]]]:
    """(file name, group) for every required test group of a draft (optional/ is skipped)."""
    found = []
    for path in data_files(f"json-schema-test-suite/tests/{draft}", "*.json", at_least=30):
        for group in json.loads(path.read_text()):
            found.append((path.name, group))
    return found


def _with_draft(schema: Any, draft: str) -> Any:
    if draft == "draft7" and isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DRAFT7_URI, **schema}  # the suite leaves the draft to the runner
    return schema


def _all_violations(schema: Any, draft: str) -> Any:
    """(path, keyword) of every error jsonschema-rs reports, unbounded: the oracle."""
    dialect = Draft.DRAFT7 if draft == "draft7" else Draft.DRAFT2020_12
    originals: dict[str, str] = {}
    validator = rs_validator(rust_patterns(_with_draft(schema, draft), dialect, originals), dialect)

    def every(instance: Any) -> set[tuple[str, str]]:
        found = set()
        for error in validator.iter_errors(instance):
            for path, keyword, _ in rs_findings(error, [], originals, 10_000):
                found.add((pointer(path), keyword))
                if keyword == "false" and not path:  # `propertyNames: false`, as callgate says it
                    found.add(("", "propertyNames"))
        return found

    return every


def _load(schema: Any, draft: str, engine: str, workdir: Path) -> Contract:
    schema = _with_draft(schema, draft)
    domain = workdir / "suite"
    domain.mkdir(parents=True, exist_ok=True)
    (domain / "case.v1.schema.json").write_text(json.dumps(schema))
    contract = load_registry(workdir, engine=engine).resolve("case", None)
    assert isinstance(contract, Contract)
    return contract


def run(draft: str, engine: str, workdir: Path) -> Tally:
    tally = Tally(engine, draft)
    for index, (file, group) in enumerate(groups(draft)):
        try:
            contract = _load(group["schema"], draft, engine, workdir / str(index))
        except SchemaLoadError:
            tally.refused_groups += 1
            tally.refused_by_file[file] = tally.refused_by_file.get(file, 0) + 1
            continue
        tally.accepted_groups += 1
        every = _all_violations(group["schema"], draft)
        for test in group["tests"]:
            tally.tests_run += 1
            violations = contract.check(test["data"])
            where = (file, group["description"], test["description"])
            if (not violations) != test["valid"]:
                tally.wrong.append((*where, test["valid"]))
            elif violations and not {(v.path, v.keyword) for v in violations} <= every(
                test["data"]
            ):
                tally.unexplained.append((*where, violations))
    return tally


ENGINES = ["fastjsonschema", "jsonschema-rs"]
DRAFTS = ["draft7", "draft2020-12"]
#: Groups refused at load, per engine and draft. A change here is a change in what callgate
#: accepts: say why in the commit. (fastjsonschema refuses what a draft-7 engine would ignore;
#: both refuse remote references, boolean root schemas and what no engine can judge.)
REFUSED = {
    ("fastjsonschema", "draft7"): 20,
    ("fastjsonschema", "draft2020-12"): 142,
    ("jsonschema-rs", "draft7"): 15,
    ("jsonschema-rs", "draft2020-12"): 28,
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a schema load tried to fetch {args[:1]}")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def test_the_suite_is_there() -> None:
    assert (SUITE / "tests" / "draft2020-12" / "type.json").is_file(), f"missing {SUITE}"
    assert len(groups("draft7")) > 200
    assert len(groups("draft2020-12")) > 300


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_every_group_is_refused_or_answered_right(
    engine: str, draft: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tally = run(draft, engine, tmp_path)
    with capsys.disabled():
        print(
            f"\nconformance {engine} {draft}: accepted groups {tally.accepted_groups}, "
            f"refused groups {tally.refused_groups}, tests run {tally.tests_run}, "
            f"silent acceptances {tally.silent_acceptances}, wrong rejections "
            f"{len(tally.wrong) - tally.silent_acceptances}"
        )
    assert tally.wrong == []
    assert tally.unexplained == []
    assert tally.refused_groups == REFUSED[(engine, draft)], tally.refused_by_file
    remote_groups = sum(1 for file, _ in groups(draft) if file == "refRemote.json")
    assert tally.refused_by_file.get("refRemote.json") == remote_groups  # nothing fetched
    assert tally.accepted_groups > tally.refused_groups  # the refusals stay the exception
