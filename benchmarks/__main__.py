"""`python -m benchmarks [name ...]`: run benchmarks, write benchmarks/results/<name>.json.

Names: core, observability, scaling, e2e, instructions (the core ratios counted in CPU
instructions under callgrind; needs valgrind), profile (a pyinstrument text profile of the core
hot path, written beside the results); none means all but instructions and profile. `--quick`
runs every benchmark at a tiny size (the smoke tests use it; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import core, e2e, instructions, observability, profile, scaling
from benchmarks.common import RESULTS, write_results


def _core(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    if quick:
        return core.run(calls=40, repeats=repeats or 2)
    return core.run(repeats=repeats or 5)


def _observability(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    if quick:
        return observability.run(calls=40, repeats=repeats or 2)
    return observability.run(repeats=repeats or 7)


def _scaling(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    if quick:
        return scaling.run(quick=True, repeats=repeats or 1)
    return scaling.run(repeats=repeats or 3)


def _e2e(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    if quick:
        return e2e.run(quick=True, repeats=repeats or 1)
    return e2e.run(repeats=repeats or 3)


def _instructions(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    if quick:
        quick_contenders = ("seed", "callgate:jsonschema-rs")
        return instructions.run(calls=10, rows=(("small", "valid"),), contenders=quick_contenders)
    return instructions.run()


def _profile(quick: bool, repeats: int | None, out: Path) -> dict[str, Any]:
    return profile.run(calls=200 if quick else 20_000, out=out)


BENCHMARKS: dict[str, Callable[[bool, int | None, Path], dict[str, Any]]] = {
    "core": _core,
    "observability": _observability,
    "scaling": _scaling,
    "e2e": _e2e,
    "instructions": _instructions,
    "profile": _profile,
}
DEFAULT = ("core", "observability", "scaling", "e2e")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name", help=", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    for name in args.names or DEFAULT:
        print(f"== {name}", file=sys.stderr, flush=True)
        body = BENCHMARKS[name](args.quick, args.repeats, args.out)
        path = write_results(name, body, args.out)
        print(f"   wrote {path}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
