"""Naming a source's schema change from its recorded columns and its Delta history."""

from __future__ import annotations

import json

from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit, schema_commits
from dbt.adapters.spark_ivm.refresh.schema_changes import (
    columns_differ,
    describe_column_diff,
    read_column_changes,
)
from ivm_compiler.compile import qualify_model
from ivm_compiler.lineage import columns_read
from ivm_compiler.parse import parse_model
from ivm_compiler.sql import TableName

HISTORY_COLUMNS = ["version", "operation", "operationParameters"]
HISTORY = [
    [5, "WRITE", {"mode": "Append"}],
    [4, "RENAME COLUMN", {"oldColumnPath": "v", "newColumnPath": "v2"}],
    [3, "DROP COLUMNS", {"columns": json.dumps(["w"])}],
    # agate hands maps over as JSON text
    [2, "ADD COLUMNS", json.dumps({"columns": json.dumps([{"column": {"name": "z"}}])})],
]
READ = {"k": "int", "v": "int", "w": "string"}


def test_history_yields_the_column_changing_commits_oldest_first():
    commits = schema_commits(HISTORY_COLUMNS, HISTORY)
    assert [c.version for c in commits] == [2, 3, 4]
    assert [c.describe() for c in commits] == [
        "ADD COLUMNS z at version 2",
        "DROP COLUMNS w at version 3",
        "RENAME COLUMN v to v2 at version 4",
    ]
    assert [c.blocks_change_feed for c in commits] == [False, True, True]


# The same history as Spark's Thrift server sends it: maps as text, their
# strings quoted but not escaped (HiveResult), which is not JSON.
THRIFT_HISTORY = [
    [4, "RENAME COLUMN", '{"oldColumnPath":"v","newColumnPath":"v2"}'],
    [3, "DROP COLUMNS", '{"columns":"["w"]"}'],
    [
        2,
        "ADD COLUMNS",
        (
            '{"columns":"[{"column":{"name":"z","type":"integer","nullable":true,'
            '"metadata":{"comment":"a \\"quoted\\" note"}},"position":null}]"}'
        ),
    ],
]


def test_history_over_thrift_reads_like_history_in_session():
    commits = schema_commits(HISTORY_COLUMNS, THRIFT_HISTORY)
    assert [c.describe() for c in commits] == [
        "ADD COLUMNS z at version 2",
        "DROP COLUMNS w at version 3",
        "RENAME COLUMN v to v2 at version 4",
    ]


def test_renamed_and_dropped_columns_are_named():
    commits = schema_commits(HISTORY_COLUMNS, HISTORY)
    now = [("k", "int"), ("v2", "int"), ("z", "int")]
    changes = read_column_changes("db.src", READ, now, commits)
    assert [(c.column, c.kind, c.describe()) for c in changes] == [
        ("v", "renamed", "column 'v' of db.src was renamed to 'v2'"),
        ("w", "dropped", "column 'w' of db.src was dropped"),
    ]


def test_a_column_gone_without_history_is_still_reported():
    changes = read_column_changes("db.src", {"v": "int"}, [("k", "int")], ())
    assert [c.detail for c in changes] == ["is gone (dropped or renamed)"]


def test_retyped_columns_compare_types_as_spark_spells_them():
    now = [("k", "integer"), ("v", "bigint"), ("w", "string")]
    changes = read_column_changes("db.src", READ, now, ())
    assert [(c.column, c.kind, c.detail) for c in changes] == [
        ("v", "retyped", "changed type from int to bigint")
    ]


def test_a_name_that_now_means_another_column_is_replaced():
    swap = (
        SchemaCommit(3, "RENAME COLUMN", {"oldColumnPath": "v", "newColumnPath": "v_old"}),
        SchemaCommit(4, "RENAME COLUMN", {"oldColumnPath": "u", "newColumnPath": "v"}),
    )
    readd = (
        SchemaCommit(3, "DROP COLUMNS", {"columns": '["w"]'}),
        SchemaCommit(4, "ADD COLUMNS", {"columns": '[{"column": {"name": "w"}}]'}),
    )
    now = [("k", "int"), ("v", "int"), ("w", "string")]
    assert [c.detail for c in read_column_changes("s", {"v": "int"}, now, swap)] == [
        "is now the column renamed from 'u'"
    ]
    assert [c.kind for c in read_column_changes("s", {"w": "string"}, now, readd)] == ["replaced"]
    # An unrelated rename leaves the columns the model reads alone.
    unrelated = (SchemaCommit(3, "RENAME COLUMN", {"oldColumnPath": "x", "newColumnPath": "y"}),)
    assert read_column_changes("s", READ, now, unrelated) == []


def test_model_column_diff():
    before = [("k", "int"), ("n", "bigint")]
    assert not columns_differ(before, [("K", "integer"), ("n", "long")])
    after = [("k", "bigint"), ("z", "int")]
    assert columns_differ(before, after)
    assert describe_column_diff(before, after) == "added z int; removed n; retyped k: int -> bigint"


def test_columns_read_follow_aliases_subqueries_and_correlation():
    src, dim = TableName("db", "src"), TableName("db", "dim")
    schemas = {
        src: [("k", "int"), ("g", "string"), ("v", "int")],
        dim: [("k", "int"), ("name", "string"), ("w", "int")],
    }
    sql = (
        "select s.k, d.name from db.src s join (select k, name from db.dim where w > 0) d "
        "on s.k = d.k where exists (select 1 from db.dim e where e.k = s.k and e.w > s.v)"
    )
    read = columns_read(qualify_model("m", parse_model("m", sql), schemas), schemas)
    assert read == {src: {"k": "int", "v": "int"}, dim: {"k": "int", "name": "string", "w": "int"}}
    star = columns_read(
        qualify_model("m", parse_model("m", "select * from db.src"), schemas), schemas
    )
    assert star[src] == {"g": "string", "k": "int", "v": "int"}
