"""Versions: one parser for file names and calls; `resolve` never raises on any version text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from tests.support.contracts import load_registry
from worker.errors import SchemaLoadError
from worker.model import Code
from worker.schemas.contract import Contract, LookupFailure
from worker.schemas.versions import MAX_VERSION_DIGITS, parse_version

FIXED = settings(derandomize=True, deadline=None, print_blob=True)
REGISTRY = load_registry(SCHEMAS)


CANONICAL = [
    ("1", "1"),
    ("v1", "1"),
    ("v01", "1"),
    ("007", "7"),
    ("0", "0"),
    ("v0", "0"),
    (2, "2"),
    (0, "0"),
    ("9" * MAX_VERSION_DIGITS, "9" * MAX_VERSION_DIGITS),
]
NOT_VERSIONS = [
    *["", "v", "vv1", "V1", "²", "٢", "१", "+1", "-1", " 1", "1 ", "1.0", "1e3", "0x1", "1_000"],
    *["9" * (MAX_VERSION_DIGITS + 1), "9" * 5000, "v" + "0" * (MAX_VERSION_DIGITS + 1)],
    *[-1, 10**MAX_VERSION_DIGITS, True, False, 1.0, None, b"1", ["1"], {"v": 1}],
]


@pytest.mark.parametrize(("raw", "canonical"), CANONICAL)
def test_what_the_layout_can_name_is_a_version(raw: object, canonical: str) -> None:
    assert parse_version(raw) == canonical


@pytest.mark.parametrize("raw", NOT_VERSIONS, ids=range(len(NOT_VERSIONS)))
def test_anything_else_is_no_version(raw: object) -> None:
    assert parse_version(raw) is None


def test_a_huge_integer_is_no_version() -> None:
    assert parse_version(10**5000) is None


_VERSION_TEXTS = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl"]), max_size=12),
    st.from_regex(r"\A[v+\- ]?[0-9]{1,20}[ \n]?\Z"),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.builds(lambda sign, digits: sign + digits, st.sampled_from("+- v\t"), st.text("0123456789")),
)


@settings(FIXED, max_examples=600)
@given(
    tool=st.one_of(st.text(), st.sampled_from(["get_weather", "weather.get_weather"])),
    version=st.one_of(_VERSION_TEXTS, st.integers(), st.none()),
)
def test_resolve_never_raises(tool: str, version: str | int | None) -> None:
    found = REGISTRY.resolve(tool, version)
    assert isinstance(found, Contract | LookupFailure)
    if isinstance(found, LookupFailure):
        assert found.code in (Code.UNKNOWN_TOOL, Code.UNKNOWN_SCHEMA_VERSION)
        if tool == "get_weather":
            assert found.code is Code.UNKNOWN_SCHEMA_VERSION
    else:
        assert version is None or parse_version(version) == found.ref.version


@settings(FIXED, max_examples=300)
@given(raw=st.one_of(_VERSION_TEXTS, st.integers()))
def test_a_parsed_version_is_canonical_and_stable(raw: str | int) -> None:
    version = parse_version(raw)
    if version is not None:
        assert version == str(int(version))
        assert parse_version(version) == version
        assert parse_version("v" + version) == version
        assert parse_version(int(version)) == version


def test_versions_in_calls_name_the_file_versions() -> None:
    for text in ("1", "v1", "v01", 1):
        found = REGISTRY.resolve("get_weather", text)
        assert isinstance(found, Contract)
        assert found.ref.version == "1"
    for text in ("²", "v²", "9" * 5000, "+1", " 1"):
        missing = REGISTRY.resolve("get_weather", text)
        assert isinstance(missing, LookupFailure)
        assert missing.code is Code.UNKNOWN_SCHEMA_VERSION


def test_a_file_version_the_parser_cannot_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    name = f"t.v{'1' * (MAX_VERSION_DIGITS + 1)}.schema.json"
    (tmp_path / "d" / name).write_text(json.dumps({"type": "object"}))
    with pytest.raises(SchemaLoadError, match="more than 9 digits") as caught:
        load_registry(tmp_path)
    assert caught.value.file is not None
    assert caught.value.file.endswith(name)


def test_file_versions_are_canonical(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.v007.schema.json").write_text(json.dumps({"type": "object"}))
    (tmp_path / "srv.v02.tools.json").write_text(
        json.dumps({"tools": [{"name": "x", "inputSchema": {"type": "object"}}]})
    )
    registry = load_registry(tmp_path)
    for tool, version in (("t", "7"), ("srv.x", "2")):
        found = registry.resolve(tool, None)
        assert isinstance(found, Contract)
        assert found.ref.version == version
