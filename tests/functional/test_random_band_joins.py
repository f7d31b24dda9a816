"""Property: joins whose conditions compare the two sides equal their query after any change sequence.

The SCD2 point-in-time lookup (`fact.ts BETWEEN dim.valid_from AND
dim.valid_to`, and the half-open form with a NULL valid_to for the current
version) and the other models of BAND_JOIN_QUERIES, over test_random_joins.py's
random sequences with an SCD2 dimension `hist` changing beside them: its rows
inserted, updated and deleted, and a key's current version closed and its
next one opened by one MERGE (one Delta commit). A padded row must appear
exactly when the versions its own time falls in are gone, and a semi or anti
join must keep a row by its own values likewise, whichever side changed.
"""

from __future__ import annotations

import pytest
from dbt.tests.util import run_dbt
from hypothesis import given
from hypothesis import strategies as st

from tests.functional.ivm_project import (
    BAND_JOIN_QUERIES,
    BAND_SOURCE_NAMES,
    HIST_DDL,
    create_join_sources,
    random_change_settings,
    sql_literal,
)
from tests.functional.test_random_joins import (
    RandomJoinChanges,
    _table_changes,
    dim_changes,
    keys,
    names,
    src_changes,
    tag_changes,
)

times = st.one_of(st.none(), st.integers(min_value=-2, max_value=2))


def _superseding(key: int | None, name: str | None, time: int) -> str:
    """One MERGE closing the key's current version at `time` and opening its next one then."""
    k, n, t = (sql_literal(v) for v in (key, name, time))
    return (
        "MERGE INTO {hist} AS h USING ("
        f"SELECT {k} AS merge_key, {k} AS k, {n} AS name, {t} AS ts "
        f"UNION ALL SELECT NULL AS merge_key, {k} AS k, {n} AS name, {t} AS ts"
        ") AS s ON h.k = s.merge_key AND h.valid_to IS NULL "
        "WHEN MATCHED THEN UPDATE SET valid_to = s.ts "
        "WHEN NOT MATCHED AND s.merge_key IS NULL THEN "
        "INSERT (k, name, valid_from, valid_to) VALUES (s.k, s.name, s.ts, NULL)"
    )


hist_changes = st.one_of(
    _table_changes(
        "hist",
        st.tuples(keys, names, times, times),
        columns={"name": names, "valid_from": times, "valid_to": times},
        where={"k": keys, "name": names},
    ),
    st.builds(_superseding, keys, names, st.integers(min_value=-2, max_value=2)),
)
statements = st.one_of(
    src_changes, src_changes, dim_changes, tag_changes, hist_changes, hist_changes
)
steps = st.lists(st.lists(statements, min_size=0, max_size=4), min_size=1, max_size=3)


class TestRandomBandJoinChanges(RandomJoinChanges):
    # In the extended command only (CONTRIBUTING.md, "Suite time"), as the
    # other outer and semi join classes: tests/rules runs these models' delta
    # rules over many more sequences in the README's command.
    pytestmark = pytest.mark.extended

    queries = BAND_JOIN_QUERIES
    source_names = BAND_SOURCE_NAMES

    @pytest.fixture(scope="class")
    def sources(self, project):
        tables = create_join_sources(project)
        hist = f"{project.test_schema}.hist"
        project.run_sql(HIST_DDL.format(table=hist))
        # Key 1's closed and current versions, a current version of key 2, and
        # NULLs: a fact at v = 0 of key 1 falls in the current one only.
        project.run_sql(
            f"INSERT INTO {hist} VALUES (1, 'x', -2, 0), (1, 'y', 0, NULL), (2, 'x', -1, NULL), "
            "(NULL, 'y', NULL, NULL)"
        )
        run_dbt(["run"])
        return {**tables, "hist": hist}

    @random_change_settings(default_examples=2)
    @given(steps=steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, sources, example_budget, steps
    ):
        self.check_steps(project, spark, sources, example_budget, steps)
