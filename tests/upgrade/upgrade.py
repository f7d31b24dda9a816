"""Issue 55 item 5: states built on the oldest supported pair refresh incrementally on the newest.

Run by scripts/test-matrix, once in each end's virtualenv over one runtime
directory (warehouse and Derby metastore), as a team upgrading Spark and
Delta under an existing project would:

    .venv-matrix/oldest/bin/python tests/upgrade/upgrade.py build DIR
    .venv-matrix/newest/bin/python tests/upgrade/upgrade.py refresh DIR

`build` creates the worked example's sources, builds its ten models and
refreshes them once after a batch (every model INCREMENTAL); `refresh` opens
the same warehouse with the newer Spark and Delta, applies another batch and
refreshes: every model must be INCREMENTAL (no rebuild) and every
ivm_matches_query test pass; then a run with no change must answer NO_CHANGE
for every model. Exits non-zero, naming the models, otherwise.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

from dbt.cli.main import dbtRunner
from pyspark.sql import SparkSession

from dbt.adapters.spark_ivm.runtime.embedded import session_configs

PROJECT_DIR = Path(__file__).resolve().parents[2] / "integration_tests"


def _example():
    """integration_tests/scripts/example.py (a script, not a package), loaded by path."""
    spec = importlib.util.spec_from_file_location("example", PROJECT_DIR / "scripts" / "example.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _spark(runtime_dir: Path) -> SparkSession:
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(runtime_dir).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _build(runtime_dir: Path, name: str, *extra: str) -> dict[str, str]:
    """`dbt build` of the example on the runtime's warehouse: each model's code, or exit."""
    run_dir = runtime_dir / "dbt" / name
    result = dbtRunner().invoke(
        [
            "build",
            "--project-dir",
            str(PROJECT_DIR),
            "--profiles-dir",
            str(PROJECT_DIR),
            "--target-path",
            str(run_dir / "target"),
            "--log-path",
            str(run_dir / "logs"),
            *extra,
        ]
    )
    if not result.success:
        raise SystemExit(f"dbt build ({name}) failed: {result.exception or 'see the log above'}")
    results = list(result.result.results)
    failed = [r.node.name for r in results if r.node.resource_type == "test" and r.status != "pass"]
    if failed:
        raise SystemExit(f"dbt build ({name}): ivm_matches_query failed for {failed}")
    codes = {
        r.node.name: str((r.adapter_response or {}).get("code"))
        for r in results
        if r.node.resource_type == "model"
    }
    print(f"{name}: {codes}")
    return codes


def _expect(codes: dict[str, str], expected: str, step: str) -> None:
    other = {name: code for name, code in codes.items() if code != expected}
    if other or not codes:
        raise SystemExit(f"{step}: expected every model {expected}, got {other or codes}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("build", "refresh"):
        print(__doc__, file=sys.stderr)
        return 2
    step, runtime_dir = argv[0], Path(argv[1]).resolve()
    spark = _spark(runtime_dir)
    print(f"{step} on Spark {spark.version}")
    example = _example()
    if step == "build":
        example.create_sources(spark, random.Random(7))
        _expect(_build(runtime_dir, "old-build", "--full-refresh"), "BUILD", "first build")
        example.apply_batch(spark, random.Random(8))
        _expect(_build(runtime_dir, "old-refresh"), "INCREMENTAL", "refresh on the old pair")
    else:
        example.apply_batch(spark, random.Random(9))
        _expect(_build(runtime_dir, "new-refresh"), "INCREMENTAL", "refresh on the new pair")
        _expect(_build(runtime_dir, "new-no-change"), "NO_CHANGE", "no change on the new pair")
    print(f"{step}: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
