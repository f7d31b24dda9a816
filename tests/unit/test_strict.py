"""Strict reads: which commit a member is read at, and what replaces the relation (fake runner)."""

from __future__ import annotations

import json

import sqlglot

from dbt.adapters.spark_ivm.consistency.publish import COMMIT_LOG_NAME
from dbt.adapters.spark_ivm.consistency.strict import (
    StrictReads,
    committed_select,
    newest_commit_naming,
)
from ivm_compiler import TableName
from tests.unit.test_publish import FakeLog

LOG = TableName(db="analytics", name=COMMIT_LOG_NAME)
BY_G = TableName("analytics", "by_g")
TOTAL = TableName("analytics", "total")


def _member(name: str, version: int) -> dict:
    state = f"analytics.{name}__ivm_state"
    return {
        "model": f"model.p.{name}",
        "relation": f"analytics.{name}",
        "state": state,
        "state_version": version,
        "view_sql": f"CREATE OR REPLACE VIEW analytics.{name} AS "
        f"SELECT n FROM {state} VERSION AS OF {version}",
    }


class CommitLogRunner:
    """Answers the two queries a strict read makes from a list of commits (oldest first)."""

    def __init__(self, commits: list[tuple[str, str, list[dict]]], shown: dict[str, int]):
        self.commits = commits
        self.shown = shown
        self.statements: list[str] = []

    def execute(self, sql: str) -> None:
        raise AssertionError(f"a strict read must not change anything: {sql}")

    def query(self, sql: str):
        self.statements.append(sql)
        if sql.startswith("DESCRIBE TABLE EXTENDED"):
            name = sql.split(".")[-1].strip("`")
            text = f"SELECT n FROM analytics.{name}__ivm_state VERSION AS OF {self.shown[name]}"
            return ["col_name", "data_type"], [["n", "bigint"], ["View Text", text]]
        relation = next(
            lit.name
            for lit in sqlglot.parse_one(sql, read="spark").find_all(sqlglot.exp.Literal)
            if lit.is_string and lit.name != "commit"
        )
        naming = [c for c in self.commits if any(m["relation"] == relation for m in c[2])]
        if not naming:
            return ["commit_id", "group_name", "members"], []
        commit_id, group, members = naming[-1]
        return ["commit_id", "group_name", "members"], [[commit_id, group, json.dumps(members)]]


def _read(reads: StrictReads, runner, relation: TableName, log_exists: bool = True):
    return reads.read(
        runner=runner,
        log=FakeLog(),
        commit_log=LOG,
        commit_log_exists=log_exists,
        relation=relation,
        state=TableName(relation.db, f"{relation.name}__ivm_state"),
    )


def test_the_query_finds_the_newest_commit_naming_the_relation():
    sql = newest_commit_naming(LOG, BY_G)
    tree = sqlglot.parse_one(sql, read="spark")
    assert "analytics.by_g" in [lit.name for lit in tree.find_all(sqlglot.exp.Literal)]
    assert tree.args["order"].expressions[0].args["desc"] is True
    assert tree.args["limit"].expression.name == "1"
    assert COMMIT_LOG_NAME in sql


def test_a_member_is_read_through_the_view_statement_of_its_commit():
    runner = CommitLogRunner(
        [("c1", "total", [_member("by_g", 4), _member("total", 7)])], shown={"by_g": 3, "total": 7}
    )
    read = _read(StrictReads("inv"), runner, BY_G)
    # The commit decided state 4; the view still shows 3 (publication window or crash).
    assert read.commit is not None and read.commit.commit_id == "c1"
    assert "VERSION AS OF 4" in read.sql
    assert read.sql.startswith("(") and read.sql.endswith(")")
    assert sqlglot.parse_one(read.sql, read="spark").find(sqlglot.exp.Select) is not None


def test_one_invocation_reads_a_group_at_one_commit_even_if_it_commits_again():
    commits = [("c1", "total", [_member("by_g", 4), _member("total", 7)])]
    runner = CommitLogRunner(commits, shown={"by_g": 4, "total": 7})
    reads = StrictReads("inv")
    first = _read(reads, runner, BY_G)
    commits.append(("c2", "total", [_member("by_g", 5), _member("total", 8)]))
    runner.shown = {"by_g": 5, "total": 8}
    second = _read(reads, runner, TOTAL)
    assert first.commit is not None and second.commit is not None
    assert first.commit.commit_id == second.commit.commit_id == "c1"
    assert "VERSION AS OF 7" in second.sql
    # A new invocation reads the newest commit.
    assert "VERSION AS OF 8" in _read(StrictReads("next"), runner, TOTAL).sql


def test_relations_without_a_group_commit_are_read_as_they_are():
    runner = CommitLogRunner([("c1", "total", [_member("total", 7)])], shown={"by_g": 2})
    reads = StrictReads("inv")
    never = _read(reads, runner, BY_G)
    assert never.commit is None and never.sql == BY_G.sql()
    assert "never published by a group commit" in (never.reason or "")
    no_log = _read(reads, runner, BY_G, log_exists=False)
    assert no_log.commit is None and no_log.sql == BY_G.sql()


def test_a_model_published_alone_after_leaving_its_group_is_read_as_it_is():
    runner = CommitLogRunner([("c1", "total", [_member("by_g", 4)])], shown={"by_g": 6})
    read = _read(StrictReads("inv"), runner, BY_G)
    assert read.commit is None and read.sql == BY_G.sql()
    assert "state version 6" in (read.reason or "")


def test_committed_select_keeps_the_recorded_select():
    select = committed_select(
        "CREATE OR REPLACE VIEW a.v (n COMMENT 'x') TBLPROPERTIES ('k'='v') "
        "AS SELECT n FROM a.s VERSION AS OF 3 WHERE n > 0"
    )
    tree = sqlglot.parse_one(select, read="spark")
    assert isinstance(tree, sqlglot.exp.Subquery)
    assert tree.find(sqlglot.exp.Where) is not None
    assert "VERSION AS OF 3" in select
