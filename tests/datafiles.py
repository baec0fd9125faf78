"""The one place tests find their data: `tests/data/`, inside the repository.

`data_path(...)` fails loudly when a file or folder is missing, so a test never shrinks to
nothing because its data was not there (see `tests/data/PROVENANCE.md`).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
REPO = DATA.parent.parent
SCHEMAS = REPO / "schemas"


def data_path(*parts: str) -> Path:
    """A path under `tests/data/` that must exist."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"test data missing: {path} (see tests/data/PROVENANCE.md)")
    return path


def data_files(folder: str, pattern: str, *, at_least: int = 1) -> list[Path]:
    """The files matching `pattern` in a data folder, sorted; at least `at_least` of them."""
    found = sorted(data_path(folder).glob(pattern))
    if len(found) < at_least:
        raise FileNotFoundError(
            f"test data missing: {len(found)} files match {folder}/{pattern}, "
            f"expected at least {at_least}"
        )
    return found
