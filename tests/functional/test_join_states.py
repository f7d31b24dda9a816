"""Join states (reverse-join tables, `ivm_join_state`): exact under random changes, kept current.

The models of test_random_joins that join plain sources, plus a three-way
join on ON conditions, all keeping a join state for every input that can
(`ivm_join_state: all`). After every refresh each model equals its query at
the versions it records (the join states stand in for the partner reads of
its MERGE), and each join state holds its source's rows (projected to the
columns the model reads, filtered by the model's conditions on that input
alone) at the model's recorded version.
"""

from __future__ import annotations

import pytest

from tests.functional.ivm_checks import bag_differences, recorded_state
from tests.functional.ivm_project import JOIN_QUERIES
from tests.functional.test_random_joins import RandomJoinChanges

JOIN_STATE_QUERIES = {
    name: JOIN_QUERIES[name] for name in ("joined_rows", "joined_groups", "self_joined")
} | {
    # Three inputs joined in ON, a filter on one of them (kept in its join state).
    "three_way_on": (
        "select s.g, d.name, t.label, count(*) as n, sum(s.v) as sv from {src} s "
        "join {dim} d on s.k = d.k join {tag} t on d.name = t.name "
        "where t.label is not null group by s.g, d.name, t.label"
    ),
}

# (model, alias) -> (source, the columns the model reads of it, its conditions on it alone)
EXPECTED_JOIN_STATES = {
    ("joined_rows", "s"): ("src", "k, v", None),
    # The subquery in FROM is merged into the model's rows, under its table's name.
    ("joined_rows", "dim"): ("dim", "k, name, w", "w is null or w > 0"),
    ("joined_groups", "s"): ("src", "k, g, v, d", None),
    ("joined_groups", "d"): ("dim", "k, name, w", None),
    ("self_joined", "a"): ("src", "k, g, v", None),
    ("self_joined", "b"): ("src", "k, g, v", None),
    ("three_way_on", "s"): ("src", "k, g, v", None),
    ("three_way_on", "d"): ("dim", "k, name", None),
    ("three_way_on", "t"): ("tag", "name, label", "label is not null"),
}


def assert_join_states_hold_their_sources(project, spark) -> None:
    """Every join state equals its source's projection at its model's recorded version."""
    schema = project.test_schema
    pairs = {}
    for (model, alias), (source, columns, condition) in EXPECTED_JOIN_STATES.items():
        table = f"{schema}.{source}"
        version = int(recorded_state(spark, schema, model).sources[table]["version"])
        kept = (
            f"SELECT {columns} FROM {schema}.{model}__ivm_join_{alias} "
            "LATERAL VIEW explode(sequence(1, __ivm_count)) c AS copy "
            "WHERE __ivm_guard IS NULL"
        )
        where = f" WHERE {condition}" if condition else ""
        pairs[f"{model}.{alias}"] = (
            kept,
            f"SELECT {columns} FROM {table} VERSION AS OF {version}{where}",
        )
    differing = [
        f"{name}: {difference}"
        for name, difference in bag_differences(spark, pairs).items()
        if not difference.equal
    ]
    assert not differing, "\n".join(differing)


class TestRandomJoinStateChanges(RandomJoinChanges):
    queries = JOIN_STATE_QUERIES

    @pytest.fixture(scope="class")
    def project_config_update(self):
        return {"models": {"+materialized": "ivm", "+ivm_join_state": "all"}}

    def _refresh_and_check(self, project, spark, sources, models=()):
        super()._refresh_and_check(project, spark, sources, models)
        assert_join_states_hold_their_sources(project, spark)
