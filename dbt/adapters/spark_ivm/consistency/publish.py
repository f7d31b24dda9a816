"""Publishing refreshed state: alone, or all members of a consistency group at once.

A model's view reads its state table at a fixed Delta version, so writing the
state publishes nothing; pointing the view at the new version does (a
metadata-only ALTER VIEW ... AS). A model on its own is published right
after its refresh. A group's members are published together after the last
one has refreshed:

1. every member writes its state (one Delta commit each) and is staged;
2. the commit point: one row appended to the commit log table, a single
   atomic Delta commit naming every member's new state version and view
   statement;
3. every member's view is pointed at its new version (ALTER VIEW ... AS, one
   metastore update per view);
4. a 'published' row closes the commit.

A crash before 2 publishes nothing (the next run refreshes from the written
state, which reflects exact source versions, and publishes then). A crash
between 2 and 4 is repaired by the next invocation's first ivm refresh, or by
`dbt run-operation ivm_repair_groups`: it re-runs the view statements of every
commit without a 'published' row whose members have no later commit.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlglot import exp, parse_one

from dbt.adapters.spark_ivm.consistency.groups import GroupProgress, GroupRun, Staged
from dbt.adapters.spark_ivm.delta.confs import commit_lock
from ivm_compiler import TableName
from ivm_compiler.sql import DIALECT

COMMIT_LOG_NAME = "ivm_group_commits"

_COMMIT_LOG_DDL = """
CREATE TABLE IF NOT EXISTS commit_log (
  commit_id STRING,
  kind STRING,
  group_name STRING,
  invocation_id STRING,
  committed_at TIMESTAMP,
  members ARRAY<STRUCT<model: STRING, relation: STRING, state: STRING, state_version: BIGINT,
                       action: STRING, seconds: DOUBLE, view_sql: STRING,
                       publish_sql: ARRAY<STRING>>>,
  source_versions MAP<STRING, BIGINT>,
  group_seconds DOUBLE
) USING DELTA
"""


class Runner(Protocol):
    """Runs SQL on the model's connection."""

    def query(self, sql: str) -> tuple[list[str], Sequence[Sequence[Any]]]: ...

    def execute(self, sql: str) -> None: ...


class Log(Protocol):
    """Where a refresh says what it does: dbt's adapter logger, or logging's in unit tests."""

    def debug(self, message: str) -> None: ...

    def info(self, message: str) -> None: ...

    def warning(self, message: str) -> None: ...


def with_table(template: str, table: TableName) -> str:
    tree = parse_one(template, read=DIALECT)
    for placeholder in [t for t in tree.find_all(exp.Table) if t.name == "commit_log"]:
        named = table.to_table()
        named.set("alias", placeholder.args.get("alias"))
        placeholder.replace(named)
    return tree.sql(dialect=DIALECT)


def create_commit_log(table: TableName) -> str:
    return with_table(_COMMIT_LOG_DDL, table)


def _string(value: str | None) -> exp.Expr:
    return exp.Null() if value is None else exp.Literal.string(value)


def _member_struct(staged: Staged) -> exp.Expr:
    fields: list[tuple[str, exp.Expr]] = [
        ("model", _string(staged.model_id)),
        ("relation", _string(str(staged.relation))),
        ("state", _string(str(staged.state))),
        ("state_version", exp.Literal.number(staged.state_version)),
        ("action", _string(staged.action)),
        ("seconds", exp.cast(exp.Literal.number(round(staged.seconds, 3)), "DOUBLE")),
        ("view_sql", _string(staged.view_sql)),
        ("publish_sql", exp.Array(expressions=[_string(q) for q in staged.publish_sql])),
    ]
    return exp.Anonymous(
        this="NAMED_STRUCT",
        expressions=[item for name, value in fields for item in (_string(name), value)],
    )


def commit_row(
    table: TableName,
    commit_id: str,
    kind: str,
    progress: GroupProgress,
    invocation_id: str,
    members: list[Staged],
) -> str:
    """INSERT of one commit-log row: the commit point ('commit') or its closing ('published')."""
    versions: dict[str, int] = {}
    for staged in members:
        versions.update(staged.source_versions)
    source_map = exp.cast(
        exp.Anonymous(
            this="MAP",
            expressions=[
                item
                for name, version in sorted(versions.items())
                for item in (_string(name), exp.Literal.number(version))
            ],
        ),
        "MAP<STRING, BIGINT>",
        dialect=DIALECT,
    )
    member_array = exp.cast(
        exp.Array(expressions=[_member_struct(s) for s in members]),
        "ARRAY<STRUCT<model: STRING, relation: STRING, state: STRING, state_version: BIGINT, "
        "action: STRING, seconds: DOUBLE, view_sql: STRING, publish_sql: ARRAY<STRING>>>",
        dialect=DIALECT,
    )
    row = exp.select(
        _string(commit_id),
        _string(kind),
        _string(progress.group.name),
        _string(invocation_id),
        exp.CurrentTimestamp(),
        member_array,
        source_map,
        exp.cast(exp.Literal.number(round(time.monotonic() - progress.started, 3)), "DOUBLE"),
    )
    return exp.insert(row, table.to_table()).sql(dialect=DIALECT)


def unpublished_commits(table: TableName) -> str:
    """Commits whose views may not all have moved (no 'published' row), oldest first."""
    return with_table(
        """
        SELECT c.commit_id, c.group_name, to_json(c.members) AS members, c.committed_at
        FROM commit_log AS c
        WHERE c.kind = 'commit'
          AND c.commit_id NOT IN (SELECT p.commit_id FROM commit_log AS p WHERE p.kind = 'published')
        ORDER BY c.committed_at
        """,
        table,
    )


def latest_commits(table: TableName) -> str:
    """The newest commit naming each model (a repair must not undo a later commit)."""
    return with_table(
        """
        SELECT m.model, max_by(c.commit_id, c.committed_at) AS commit_id
        FROM commit_log AS c LATERAL VIEW explode(c.members) exploded AS m
        WHERE c.kind = 'commit'
        GROUP BY m.model
        """,
        table,
    )


@dataclass
class Publisher:
    """Publishes one model's refreshed state, alone or through its group."""

    runner: Runner
    log: Log
    model: str
    commit_log: TableName
    group_run: GroupRun | None = None
    progress: GroupProgress | None = None
    relation_exists: Callable[[TableName], str | None] = lambda table: None
    # Whether the connection's Spark session is its own (delta.confs.commit_lock).
    own_session: bool = False

    @property
    def grouped(self) -> bool:
        """Whether the member publishes through its group: with others, or after other groups."""
        return self.progress is not None and (
            len(self.progress.group.members) > 1 or bool(self.progress.after)
        )

    def publish(self, staged: Staged) -> str | None:
        """Show the member's state now, or with its group; None, or why the view did not move.

        The answer goes into the model's dbt result, so a run's summary names
        every view that still shows an earlier state.
        """
        if not self.grouped:
            for statement in () if staged.published else staged.publish_sql:
                self.runner.execute(statement)
            return None
        assert self.group_run is not None and self.progress is not None
        with self.group_run.lock:
            self.progress.staged[staged.model_id] = staged
            self._commit_if_complete()
            return None if staged.published else self._withheld(self.progress)

    @staticmethod
    def _withheld(progress: GroupProgress) -> str | None:
        """Why a staged member's view does not show its new state yet (None: it does)."""
        group = progress.group.name
        if progress.failed is not None:
            return (
                f"withheld: consistency group {group!r} publishes nothing in this run, as "
                f"{progress.failed} failed; the view shows the group's last commit"
            )
        if progress.committed:
            return None
        if not progress.waiting:
            return (
                f"not yet shown: consistency group {group!r} publishes it after "
                + ", ".join(repr(g) for g in sorted(progress.after))
                + ", whose states it read, publish"
            )
        return (
            f"not yet shown: consistency group {group!r} publishes it when "
            f"{len(progress.waiting)} more member(s) have refreshed"
        )

    def withdraw(self) -> None:
        """The member is not maintained (fallback): the group no longer waits for it."""
        if not self.grouped:
            return
        assert self.group_run is not None and self.progress is not None
        with self.group_run.lock:
            self.progress.withdrawn.add(self.model)
            self._commit_if_complete()

    def fail(self, error: BaseException) -> None:
        """A member failed: nothing of its group, nor of the groups that read it, is published."""
        if self.group_run is None or self.progress is None:
            return
        with self.group_run.lock:
            self._withhold_readers(self.progress.group.name)
        if not self.grouped:
            return
        with self.group_run.lock:
            if self.progress.failed is None:
                self.progress.failed = self.model
            staged = ", ".join(sorted(self.progress.staged)) or "none"
            decided = self.progress.committed
        if decided:
            self.log.warning(
                f"consistency group {self.progress.group.name!r}: its commit was decided, but "
                f"publishing stopped at {self.model}; the next run (or `dbt run-operation "
                "ivm_repair_groups`) points the remaining views at the committed state"
            )
            return
        self.log.warning(
            f"consistency group {self.progress.group.name!r}: {self.model} failed, so no member "
            f"publishes in this run (members already refreshed: {staged}); their views keep "
            "showing the last committed group state, and the next run publishes them all"
        )

    def _withhold_readers(self, failed_group: str) -> None:
        """Groups that read `failed_group`'s unpublished states publish nothing in this run either.

        Their members' states reflect states of that group no reader will
        see; the next run reads on from those states as it would after any
        withheld publication.
        """
        assert self.group_run is not None
        for reader in self.group_run.progresses():
            if failed_group in reader.after and not reader.committed and reader.failed is None:
                reader.failed = f"consistency group {failed_group!r}, whose states it read,"
                self.log.warning(
                    f"consistency group {reader.group.name!r} publishes nothing in this run: "
                    f"its members read states of {failed_group!r}, which does not publish them"
                )
                self._withhold_readers(reader.group.name)

    def _commit_if_complete(self, progress: GroupProgress | None = None) -> None:
        """Commit the group once every member is in and every group it read has published.

        After a commit, the groups that were waiting only for this one commit too.
        """
        assert self.group_run is not None and self.progress is not None
        progress = progress or self.progress
        if not progress.complete or progress.committed:
            waiting = progress.waiting
            if waiting and progress.failed is None and progress is self.progress:
                self.log.info(
                    f"{self.model}: refreshed; consistency group {progress.group.name!r} "
                    f"publishes when {len(waiting)} more member(s) have refreshed"
                )
            return
        upstream = {p.group.name: p for p in self.group_run.progresses()}
        failed = sorted(g for g in progress.after if upstream[g].failed is not None)
        if failed:
            self._withhold_readers(failed[0])
            if progress.failed is None:
                progress.failed = f"consistency group {failed[0]!r}, whose states it read,"
            return
        pending = sorted(g for g in progress.after if not upstream[g].committed)
        if pending:
            self.log.info(
                f"consistency group {progress.group.name!r}: every member refreshed; it "
                f"publishes after {', '.join(map(repr, pending))}, whose states it read"
            )
            return
        progress.committed = True
        self._commit_members(progress)
        for reader in self.group_run.progresses():
            if progress.group.name in reader.after and not reader.committed:
                self._commit_if_complete(reader)

    def _commit_members(self, progress: GroupProgress) -> None:
        members = [
            progress.staged[m.model_id]
            for m in progress.group.members
            if m.model_id in progress.staged
        ]
        moving = [s for s in members if not s.published]
        if not moving:
            self.log.info(
                f"consistency group {progress.group.name!r}: no member changed, nothing to publish"
            )
            return
        if len(progress.group.members) == 1:
            # A model on its own that waited for the groups it read: one view
            # moves, so there is nothing for a commit row to make atomic.
            for statement in moving[0].publish_sql:
                self.runner.execute(statement)
            return
        self._commit(progress, members, moving)

    def _ensure_commit_log(self) -> None:
        if self.relation_exists(self.commit_log) is not None:
            return
        if self.commit_log.db:
            self.runner.execute(
                exp.Create(
                    this=exp.Table(this=exp.to_identifier(self.commit_log.db, quoted=True)),
                    kind="SCHEMA",
                    exists=True,
                ).sql(dialect=DIALECT)
            )
        self.runner.execute(create_commit_log(self.commit_log))

    def _commit(self, progress: GroupProgress, members: list[Staged], moving: list[Staged]) -> None:
        """The commit row (the commit point), every moving view, then the published row."""
        assert self.group_run is not None
        commit_id = uuid.uuid4().hex
        self._ensure_commit_log()
        invocation = self.group_run.invocation_id
        # The commit point: from here on the group's new state is decided.
        self._append(
            commit_row(self.commit_log, commit_id, "commit", progress, invocation, members)
        )
        started = time.monotonic()
        for staged in moving:
            for statement in staged.publish_sql:
                self.runner.execute(statement)
        window = time.monotonic() - started
        self._append(
            commit_row(self.commit_log, commit_id, "published", progress, invocation, members)
        )
        shown = ", ".join(
            f"{s.relation}@{s.state_version} ({s.action}, {s.seconds:.1f}s)" for s in members
        )
        sources = ", ".join(
            f"{name}@{version}"
            for name, version in sorted(
                {k: v for s in members for k, v in s.source_versions.items()}.items()
            )
        )
        self.log.info(
            f"consistency group {progress.group.name!r} committed {commit_id[:12]}: {shown}; "
            f"sources {sources}; group refresh {time.monotonic() - progress.started:.1f}s, "
            f"views moved within {window:.2f}s (log: {self.commit_log})"
        )

    def _append(self, row_insert: str) -> None:
        """Append to the commit log, never while a refresh's commit confs are set (delta.confs)."""
        with commit_lock(shared_session=not self.own_session):
            self.runner.execute(row_insert)

    def repair(self) -> int:
        """Finish every commit whose views did not all move; returns how many were repaired."""
        if self.relation_exists(self.commit_log) is None:
            return 0
        columns, rows = self.runner.query(unpublished_commits(self.commit_log))
        repaired = 0
        for row in rows:
            record = dict(zip(columns, row))
            members = json.loads(str(record["members"]))
            _, latest_rows = self.runner.query(latest_commits(self.commit_log))
            latest = {str(r[0]): str(r[1]) for r in latest_rows}
            for member in members:
                if latest.get(member["model"]) == record["commit_id"]:
                    for statement in member["publish_sql"]:
                        self.runner.execute(statement)
            self._append(
                _published_marker(
                    self.commit_log, str(record["commit_id"]), str(record["group_name"])
                )
            )
            self.log.warning(
                f"consistency group {record['group_name']!r}: commit {str(record['commit_id'])[:12]} "
                "was decided but not every view had moved (the run stopped midway); "
                "its views now show it"
            )
            repaired += 1
        return repaired


def _published_marker(table: TableName, commit_id: str, group: str) -> str:
    row = exp.select(
        _string(commit_id),
        _string("published"),
        _string(group),
        exp.Null(),
        exp.CurrentTimestamp(),
        exp.Null(),
        exp.Null(),
        exp.Null(),
    )
    return exp.insert(row, table.to_table()).sql(dialect=DIALECT)
