"""dbt driven in-process through dbtRunner: one parse, then one invocation per model run.

Every invocation reuses the manifest of one parse (dbtRunner(manifest=...)), so
a measured run pays no parsing, and runs on the process's warm SparkSession
(dbt-spark's session method reuses it). A model's time is dbt's own
``execution_time`` of its node: the materialization, from compiling the model to
its last statement; the whole invocation's wall time is kept beside it.

Project vars that models read in ``config()`` (``bench_ivm_group``) take effect
at parse time, so each set of such vars has its own parsed manifest: parse with
them once, then pass the same vars to every invocation that should see them.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbt.cli.main import dbtRunner

# The events of the adapter's own logger at info level and above (dbt-spark-ivm's
# lines, e.g. a consistency group's commit summary; its debug lines are the SQL).
ADAPTER_EVENTS = frozenset({"AdapterEventInfo", "AdapterEventWarning", "AdapterEventError"})


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


@dataclass(frozen=True)
class Invocation:
    """One dbt invocation that ran several models."""

    ok: bool
    seconds: float  # wall time, dbt's own overhead included
    # dbt's id of the invocation: the group commit log's rows carry it.
    invocation_id: str | None
    nodes: tuple[ModelRun, ...]
    # What the adapter logged at info level and above, in order (dbt's --quiet
    # keeps it off the console; the group commit's summary line is among them).
    adapter_messages: tuple[str, ...]
    error: str | None = None


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
        base_vars: Mapping[str, str] | None = None,
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
        # Vars every invocation passes, parse included (e.g. bench_ivm_join_state).
        self.base_vars = dict(base_vars or {})
        # One parsed manifest per set of extra vars (see the module's docstring).
        self._manifests: dict[str, Any] = {}

    def parse(self, extra_vars: Mapping[str, str] | None = None) -> float:
        """Parse the project (seconds taken); later invocations with the same vars reuse it."""
        started = time.monotonic()
        result = self._invoke(dbtRunner(), ["parse"], extra_vars)
        if not result.success:
            raise RuntimeError(f"dbt parse failed: {result.exception}")
        self._manifests[_vars_key(extra_vars)] = result.result
        return time.monotonic() - started

    def run_model(self, model: str, *, full_refresh: bool = False) -> ModelRun:
        args = ["run", "--select", model]
        if full_refresh:
            args.append("--full-refresh")
        started = time.monotonic()
        result = self._invoke(dbtRunner(manifest=self._manifest_for(None)), args)
        invocation_seconds = time.monotonic() - started
        node_results = list(getattr(result.result, "results", None) or [])
        if len(node_results) != 1:
            message = str(result.exception or f"dbt selected {len(node_results)} nodes")
            return ModelRun(model, False, 0.0, invocation_seconds, "ERROR", message)
        return _model_run(node_results[0], invocation_seconds)

    def run_models(
        self, models: Sequence[str], *, extra_vars: Mapping[str, str] | None = None
    ) -> Invocation:
        """Every model of ``models`` in one invocation (one set of consistency groups)."""
        manifest = self._manifest_for(extra_vars)
        adapter_messages: list[str] = []
        invocation_ids: Counter[str] = Counter()

        def listen(event: Any) -> None:
            invocation_ids[event.info.invocation_id] += 1
            if event.info.name in ADAPTER_EVENTS:
                adapter_messages.append(str(event.info.msg))

        started = time.monotonic()
        result = self._invoke(
            dbtRunner(manifest=manifest, callbacks=[listen]),
            ["run", "--select", *models],
            extra_vars,
        )
        seconds = time.monotonic() - started
        node_results = list(getattr(result.result, "results", None) or [])
        nodes = tuple(_model_run(node, seconds) for node in node_results)
        error = str(result.exception) if result.exception else None
        if len(nodes) != len(models):
            error = error or f"dbt ran {len(nodes)} of the {len(models)} models selected"
        return Invocation(
            ok=error is None and all(node.ok for node in nodes),
            seconds=seconds,
            # The run's events carry its id (the commit log's rows do too); the
            # most common one, in case an event fired before dbt set it.
            invocation_id=invocation_ids.most_common(1)[0][0] if invocation_ids else None,
            nodes=nodes,
            adapter_messages=tuple(adapter_messages),
            error=error,
        )

    def _manifest_for(self, extra_vars: Mapping[str, str] | None) -> Any:
        manifest = self._manifests.get(_vars_key(extra_vars))
        if manifest is None:
            raise RuntimeError(f"parse() the project with vars {dict(extra_vars or {})} first")
        return manifest

    def _invoke(
        self, runner: dbtRunner, args: list[str], extra_vars: Mapping[str, str] | None = None
    ) -> Any:
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
                json.dumps(
                    {
                        "tpch_source_schema": self.source_schema,
                        **self.base_vars,
                        **(extra_vars or {}),
                    }
                ),
                # The harness prints its own progress; errors still reach stderr.
                "--quiet",
                # No tracking events (this machine has no route to dbt's collector,
                # and a benchmark should not wait on one) and no .user.yml file.
                "--no-send-anonymous-usage-stats",
                "--log-level-file",
                self.log_level_file,
            ]
        )


def _model_run(node: Any, invocation_seconds: float) -> ModelRun:
    """One node's result: dbt's execution time and the adapter response's action."""
    response = node.adapter_response or {}
    ok = str(node.status) == "success"
    return ModelRun(
        model=str(node.node.name),
        ok=ok,
        seconds=float(node.execution_time),
        invocation_seconds=invocation_seconds,
        action=str(response.get("code") or ("OK" if ok else "ERROR")),
        message=str(response.get("_message") or node.message or ""),
    )


def _vars_key(extra_vars: Mapping[str, str] | None) -> str:
    return json.dumps(dict(sorted((extra_vars or {}).items())))
