"""Strict reads: members of a consistency group read at one committed group state.

A plain read of several members' views can straddle a group commit while
the views move (the publication window). A strict read never does: it reads
each member through the view statement recorded for it in one commit row of
the commit log (its state `VERSION AS OF` the committed version), so every
member read this way shows the same group state, even while the views are
still moving or a crash left them half-moved.

Within one dbt invocation the first strict read of a group fixes the commit
every later strict read of that group uses: downstream models built in one
run never mix two group states, even if the group commits again meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlglot import exp, parse_one

from dbt.adapters.spark_ivm.consistency.publish import Log, Runner, with_table
from dbt.adapters.spark_ivm.refresh.upstreams import version_read, view_text
from ivm_compiler import TableName
from ivm_compiler.sql import DIALECT


@dataclass(frozen=True)
class Commit:
    commit_id: str
    group: str
    # Each member as the commit log stores it (model, relation, state,
    # state_version, view_sql, ...).
    members: tuple[dict, ...]

    def member(self, relation: TableName) -> dict | None:
        return next((m for m in self.members if m["relation"] == str(relation)), None)


@dataclass(frozen=True)
class StrictRead:
    """What a strict read of one relation resolved to."""

    relation: TableName
    # A parenthesised SELECT to put where the relation would go.
    sql: str
    commit: Commit | None
    # Why the relation is read as is (no commit to read it at), for the log.
    reason: str | None = None


def newest_commit_naming(table: TableName, relation: TableName) -> str:
    """The newest commit row with `relation` among its members."""
    query = parse_one(
        with_table(
            """
            SELECT c.commit_id, c.group_name, to_json(c.members) AS members
            FROM commit_log AS c LATERAL VIEW explode(c.members) exploded AS m
            WHERE c.kind = 'commit' AND m.relation = relation_placeholder
            ORDER BY c.committed_at DESC
            LIMIT 1
            """,
            table,
        ),
        read=DIALECT,
    )
    placeholder = next(c for c in query.find_all(exp.Column) if c.name == "relation_placeholder")
    placeholder.replace(exp.Literal.string(str(relation)))
    return query.sql(dialect=DIALECT)


def view_select(view_sql: str) -> exp.Query:
    """The SELECT of a recorded view statement (CREATE ... VIEW ... AS SELECT)."""
    statement = parse_one(view_sql, read=DIALECT)
    select = statement.expression if isinstance(statement, exp.Create) else statement
    if not isinstance(select, exp.Query):
        raise TypeError(f"not a view statement: {view_sql[:200]}")
    return select


def committed_select(view_sql: str) -> str:
    """The SELECT of a recorded view statement, parenthesised for use as a relation."""
    return exp.paren(view_select(view_sql).copy()).sql(dialect=DIALECT)


@dataclass
class StrictReads:
    """The strict reads of one dbt invocation: one commit per group, fixed at its first read."""

    invocation_id: str
    _chosen: dict[str, Commit] = field(default_factory=dict)

    def read(
        self,
        runner: Runner,
        log: Log,
        commit_log: TableName,
        commit_log_exists: bool,
        relation: TableName,
        state: TableName,
    ) -> StrictRead:
        plain = relation.sql()
        if not commit_log_exists:
            return StrictRead(relation, plain, None, "no consistency group has committed yet")
        columns, rows = runner.query(newest_commit_naming(commit_log, relation))
        if not rows:
            return StrictRead(relation, plain, None, "it was never published by a group commit")
        record = dict(zip(columns, rows[0]))
        newest = Commit(
            commit_id=str(record["commit_id"]),
            group=str(record["group_name"]),
            members=tuple(json.loads(str(record["members"]))),
        )
        newest_member = newest.member(relation)
        assert newest_member is not None  # the query selected commits naming it
        text = view_text(runner, relation)
        shown = version_read(parse_one(text, read=DIALECT), state) if text else None
        if shown is not None and shown > int(newest_member["state_version"]):
            # Published on its own since its last group commit (it left the
            # group): its view is the only committed state there is.
            return StrictRead(
                relation,
                plain,
                None,
                f"its view shows state version {shown}, published after its last group commit",
            )
        chosen = self._chosen.setdefault(newest.group, newest)
        member = chosen.member(relation) or newest_member
        commit = chosen if chosen.member(relation) else newest
        if commit is not newest:
            log.info(
                f"strict read of {relation}: group {commit.group!r} is read at commit "
                f"{commit.commit_id[:12]} throughout this invocation "
                f"(a newer one, {newest.commit_id[:12]}, landed meanwhile)"
            )
        return StrictRead(relation, committed_select(str(member["view_sql"])), commit)
