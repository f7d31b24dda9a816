"""dbt driven in-process through dbtRunner: one parse, then one invocation per model run.

Every invocation reuses the manifest of one parse (dbtRunner(manifest=...)), so
a measured run pays no parsing, and runs on the process's warm SparkSession
(dbt-spark's session method reuses it). A model's time is dbt's own
``execution_time`` of its node: the materialization, from compiling the model to
its last statement; the whole invocation's wall time is kept beside it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbt.cli.main import dbtRunner


@dataclass(frozen=True)
class ModelRun:
    model: str
    ok: bool
    seconds: float  # dbt's execution time of the model's node
    invocation_seconds: float  # the whole dbt invocation, dbt's own overhead included
    # The adapter response's code: the ivm refresh's action (BUILD, REBUILD,
    # INCREMENTAL, NO_CHANGE, FALLBACK) or dbt-spark's OK for a table.
    action: str
    message: str


class DbtProject:
    def __init__(
        self,
        project_dir: Path,
        *,
        runtime_dir: Path,
        model_schema: str,
        source_schema: str,
        target_dir: Path,
        log_dir: Path,
        log_level_file: str = "info",
    ) -> None:
        self.project_dir = project_dir
        self.runtime_dir = runtime_dir
        self.model_schema = model_schema
        self.source_schema = source_schema
        self.target_dir = target_dir
        self.log_dir = log_dir
        # "debug" writes every statement with its duration to dbt.log: a profile
        # of where a refresh's time goes.
        self.log_level_file = log_level_file
        self._manifest: Any = None

    def parse(self) -> float:
        """Parse the project once (seconds taken); later invocations reuse the manifest."""
        started = time.monotonic()
        result = self._invoke(dbtRunner(), ["parse"])
        if not result.success:
            raise RuntimeError(f"dbt parse failed: {result.exception}")
        self._manifest = result.result
        return time.monotonic() - started

    def run_model(self, model: str, *, full_refresh: bool = False) -> ModelRun:
        if self._manifest is None:
            raise RuntimeError("parse() the project before running models")
        args = ["run", "--select", model]
        if full_refresh:
            args.append("--full-refresh")
        started = time.monotonic()
        result = self._invoke(dbtRunner(manifest=self._manifest), args)
        invocation_seconds = time.monotonic() - started
        node_results = list(getattr(result.result, "results", None) or [])
        if len(node_results) != 1:
            message = str(result.exception or f"dbt selected {len(node_results)} nodes")
            return ModelRun(model, False, 0.0, invocation_seconds, "ERROR", message)
        node = node_results[0]
        response = node.adapter_response or {}
        ok = str(node.status) == "success"
        return ModelRun(
            model=model,
            ok=ok,
            seconds=float(node.execution_time),
            invocation_seconds=invocation_seconds,
            action=str(response.get("code") or ("OK" if ok else "ERROR")),
            message=str(response.get("_message") or node.message or ""),
        )

    def _invoke(self, runner: dbtRunner, args: list[str]) -> Any:
        # profiles.yml reads these: the model schema of this scale factor, and the
        # runtime directory of the session the harness started.
        os.environ["TPCH_BENCH_MODEL_SCHEMA"] = self.model_schema
        os.environ["TPCH_BENCH_RUNTIME_DIR"] = str(self.runtime_dir)
        return runner.invoke(
            [
                *args,
                "--project-dir",
                str(self.project_dir),
                "--profiles-dir",
                str(self.project_dir),
                "--target-path",
                str(self.target_dir),
                "--log-path",
                str(self.log_dir),
                "--vars",
                json.dumps({"tpch_source_schema": self.source_schema}),
                # The harness prints its own progress; errors still reach stderr.
                "--quiet",
                # No tracking events (this machine has no route to dbt's collector,
                # and a benchmark should not wait on one) and no .user.yml file.
                "--no-send-anonymous-usage-stats",
                "--log-level-file",
                self.log_level_file,
            ]
        )
