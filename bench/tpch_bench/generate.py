"""TPC-H data as parquet, written by tpchgen-cli (PyPI, a Rust port of dbgen).

Two sets per scale factor:

- ``base/<table>.parquet``: the tables the models read, loaded once;
- ``parts/<table>/<table>.<k>.parquet`` for orders and lineitem with ``--parts 1000``:
  part k holds SF * 1,500 orders and exactly their lineitems, one TPC-H refresh
  function's worth of rows. RF1 inserts a part's rows under shifted keys, RF2
  deletes the orders of another part (batches.py).

Generation is deterministic, so a finished directory is kept and reused (marked by
``generated.json``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# partsupp is left out: none of the benchmarked queries reads it.
LOADED_TABLES = ("region", "nation", "supplier", "customer", "part", "orders", "lineitem")
PARTED_TABLES = ("orders", "lineitem")
# 1,000 parts make one part a TPC-H refresh function's batch (SF * 1,500 orders).
PART_COUNT = 1000
MARKER = "generated.json"


@dataclass(frozen=True)
class GeneratedData:
    scale_factor: float
    directory: Path
    seconds: float  # 0 when reused from an earlier run
    reused: bool

    def base_file(self, table: str) -> Path:
        return self.directory / "base" / f"{table}.parquet"

    def part_file(self, table: str, part: int) -> Path:
        if not 1 <= part <= PART_COUNT:
            raise ValueError(f"part must be in 1..{PART_COUNT}, got {part}")
        return self.directory / "parts" / table / f"{table}.{part}.parquet"


def tpchgen_executable() -> str:
    """tpchgen-cli from the same environment as this Python (bench/requirements.txt)."""
    beside_python = Path(sys.executable).parent / "tpchgen-cli"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise RuntimeError(
            "tpchgen-cli is not installed: run bench/run, which installs "
            "bench/requirements.txt, or pip install -r bench/requirements.txt"
        )
    return found


def generate(scale_factor: float, directory: Path) -> GeneratedData:
    """The base tables and the refresh parts at ``scale_factor``, generated unless already there."""
    marker = directory / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("scale_factor") == scale_factor:
        return GeneratedData(scale_factor, directory, seconds=0.0, reused=True)
    if directory.exists():
        shutil.rmtree(directory)  # an interrupted generation: start over
    directory.mkdir(parents=True)
    started = time.monotonic()
    _tpchgen(scale_factor, directory / "base", LOADED_TABLES)
    _tpchgen(scale_factor, directory / "parts", PARTED_TABLES, "--parts", str(PART_COUNT))
    seconds = time.monotonic() - started
    marker.write_text(json.dumps({"scale_factor": scale_factor, "seconds": round(seconds, 2)}))
    return GeneratedData(scale_factor, directory, seconds=seconds, reused=False)


def _tpchgen(scale_factor: float, output: Path, tables: tuple[str, ...], *extra: str) -> None:
    command = [
        tpchgen_executable(),
        "parquet",
        "--scale-factor",
        f"{scale_factor:g}",
        "--output-dir",
        str(output),
        "--tables",
        ",".join(tables),
        "--quiet",
        "--no-progress",
        *extra,
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"tpchgen-cli failed ({completed.returncode}): {' '.join(command)}\n"
            f"{completed.stderr.strip()}"
        )
