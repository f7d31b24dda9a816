"""refresh/unchanged.py: the no-change shortcut's key, record and comparison, without Spark.

`check` runs against a runner that answers the two statements it may send
(the view's SHOW TBLPROPERTIES and DESCRIBE TABLE EXTENDED); the pins are
made here, as refresh/pins.py would make them from a source's history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from dbt.adapters.spark_ivm.delta.history import CommitRows
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, show_properties
from dbt.adapters.spark_ivm.refresh import unchanged, upstreams
from dbt.adapters.spark_ivm.refresh.decision import NO_SOURCE_COMMITS, ONLY_PRESERVING_COMMITS
from dbt.adapters.spark_ivm.refresh.unchanged import Publication, Unchanged
from dbt.adapters.spark_ivm.settings import JoinStateSetting, RefreshSettings, Strategy
from ivm_compiler import InvalidSource, TableName, emit

ORDERS = TableName("raw", "orders")
CUSTOMERS = TableName("raw", "customers")
TARGET = TableName("analytics", "m")
UPSTREAM = TableName("analytics", "upstream")
STATE = TableName("analytics", "m__ivm_state")
KEY = unchanged.refresh_key("select 1", RefreshSettings(), {})


def commit(version: int, at: str, operation: str = "WRITE") -> CommitRows:
    return CommitRows(
        version,
        rows=None if operation == "OPTIMIZE" else 1,
        preserves_data=operation == "OPTIMIZE",
        operation=operation,
        committed_at=at,
    )


def snapshot(table: TableName, *commits: CommitRows) -> SourceSnapshot:
    """A pin at the newest of `commits`, its history holding them all."""
    return SourceSnapshot(
        table,
        None,
        max(c.version for c in commits),
        recent_commits=tuple(sorted(commits, key=lambda c: -c.version)),
        history_from=min(c.version for c in commits),
    )


ORDERS_AT_4 = snapshot(
    ORDERS, commit(3, "2026-11-29 10:00:00.000"), commit(4, "2026-11-29 10:00:05.000")
)
CUSTOMERS_AT_2 = snapshot(CUSTOMERS, commit(2, "2026-11-29 09:00:00.000"))


def published(*sources: SourceSnapshot, read: Sequence[TableName] | None = None) -> dict[str, str]:
    """The view properties a publication of state version 7 over `sources` writes."""
    return {
        unchanged.KEY_PROPERTY: KEY,
        unchanged.SOURCES_PROPERTY: unchanged.sources_property(
            sources, [s.table for s in sources] if read is None else read
        ),
        emit.STATE_VERSION_PROPERTY: "7",
    }


class TestRefreshKey:
    def test_equal_inputs_give_equal_keys(self) -> None:
        assert unchanged.refresh_key("select 1", RefreshSettings(), {"a.b": "ivm"}) == (
            unchanged.refresh_key("select 1", RefreshSettings(), {"A.B": "ivm"})
        )

    @pytest.mark.parametrize(
        "sql, settings, upstream",
        [
            ("select 2", RefreshSettings(), {}),
            ("select 1", RefreshSettings(strategy=Strategy.RECOMPUTE), {}),
            ("select 1", RefreshSettings(join_state=JoinStateSetting.ALL), {}),
            ("select 1", RefreshSettings(join_state=("o",)), {}),
            ("select 1", RefreshSettings(window_order_unique=True), {}),
            ("select 1", RefreshSettings(change_feed=False), {}),
            ("select 1", RefreshSettings(), {"a.b": "table"}),
        ],
    )
    def test_what_compiles_the_plan_changes_the_key(self, sql, settings, upstream) -> None:
        assert unchanged.refresh_key(sql, settings, upstream) != KEY

    def test_a_full_refresh_and_docs_do_not(self) -> None:
        settings = RefreshSettings(full_refresh=True, docs=emit.ViewDocs(description="d"))
        assert unchanged.refresh_key("select 1", settings, {}) == KEY


class TestPublication:
    def test_reads_back_what_a_publication_records(self) -> None:
        found = Publication.of(published(ORDERS_AT_4, CUSTOMERS_AT_2, read=[ORDERS]), KEY)
        assert isinstance(found, Publication)
        assert found.state_version == 7
        assert found.sources[ORDERS] == {"version": 4, "committed_at": "2026-11-29 10:00:05.000"}
        # The customers are read only by a plan node: not the model's own source.
        assert found.sources[CUSTOMERS][unchanged.THROUGH_NODES] is True
        assert found.read == [ORDERS]

    def test_another_key_cannot_tell(self) -> None:
        properties = {**published(ORDERS_AT_4), unchanged.KEY_PROPERTY: "other"}
        assert "other SQL or settings" in Publication.of(properties, KEY)

    def test_a_view_without_the_record_cannot_tell(self) -> None:
        properties = published(ORDERS_AT_4)
        del properties[unchanged.SOURCES_PROPERTY]
        assert "does not record" in Publication.of(properties, KEY)


def entries_of(*sources: SourceSnapshot):
    found = Publication.of(published(*sources), KEY)
    assert isinstance(found, Publication)
    return found.sources


class TestCompare:
    def test_same_versions_are_no_change(self) -> None:
        pinned = {ORDERS: ORDERS_AT_4, CUSTOMERS: CUSTOMERS_AT_2}
        assert unchanged.compare(entries_of(ORDERS_AT_4, CUSTOMERS_AT_2), pinned) is None

    def test_a_commit_since_is_a_change(self) -> None:
        later = snapshot(ORDERS, *ORDERS_AT_4.recent_commits, commit(5, "2026-11-29 10:01:00.000"))
        reason = unchanged.compare(entries_of(ORDERS_AT_4), {ORDERS: later})
        assert reason == f"{ORDERS} is at version 5, recorded at 4"

    def test_only_compactions_since_keep_the_rows(self) -> None:
        later = snapshot(
            ORDERS, *ORDERS_AT_4.recent_commits, commit(5, "2026-11-29 10:01:00.000", "OPTIMIZE")
        )
        found = unchanged.compare(entries_of(ORDERS_AT_4), {ORDERS: later})
        assert found == ONLY_PRESERVING_COMMITS

    def test_a_table_recreated_to_the_recorded_version_is_not_the_recorded_one(self) -> None:
        recreated = snapshot(
            ORDERS, commit(3, "2026-11-29 11:00:00.000"), commit(4, "2026-11-29 11:00:05.000")
        )
        reason = unchanged.compare(entries_of(ORDERS_AT_4), {ORDERS: recreated})
        assert reason == f"{ORDERS} may not be the table recorded at version 4"

    def test_a_replace_in_the_log_since_is_a_change(self) -> None:
        replaced = snapshot(
            ORDERS,
            *ORDERS_AT_4.recent_commits,
            commit(5, "2026-11-29 10:01:00.000", "CREATE OR REPLACE TABLE AS SELECT"),
        )
        reason = unchanged.compare(entries_of(ORDERS_AT_4), {ORDERS: replaced})
        assert reason == f"{ORDERS} may not be the table recorded at version 4"


class FakeRunner:
    """Answers views' properties and the model's view text; records every statement."""

    def __init__(
        self,
        properties: dict[str, str],
        view_version: int = 7,
        upstream: dict[str, str] | None = None,
    ) -> None:
        self.properties = properties
        self.upstream = upstream or {}
        self.text = f"SELECT a FROM {STATE.sql()} VERSION AS OF {view_version}"
        self.statements: list[str] = []

    def view_properties(self) -> dict[str, str]:
        """The view's properties, as the refresh reads them before the check."""
        _, rows = self.query(show_properties(TARGET))
        return {str(k): str(v) for k, v in rows}

    def query(self, sql: str) -> tuple[list[str], Sequence[Sequence[Any]]]:
        self.statements.append(sql)
        if sql == show_properties(TARGET):
            return ["key", "value"], list(self.properties.items())
        if sql == show_properties(UPSTREAM):
            return ["key", "value"], list(self.upstream.items())
        if sql.startswith("DESCRIBE TABLE EXTENDED"):
            return ["col_name", "data_type", "comment"], [("View Text", self.text, "")]
        raise AssertionError(f"unexpected statement {sql}")

    def execute(self, sql: str) -> None:
        raise AssertionError(f"the check writes nothing: {sql}")


def check(runner: FakeRunner, pins: dict[TableName, SourceSnapshot], way=unchanged.SOURCE):
    pinned: list[TableName] = []

    def pin(table: TableName) -> SourceSnapshot:
        pinned.append(table)
        return pins[table]

    found = unchanged.check(
        runner, TARGET, STATE, runner.view_properties(), KEY, pin, lambda table: way
    )
    return found, pinned


class TestCheck:
    def test_unchanged_sources_under_the_published_view(self) -> None:
        runner = FakeRunner(published(ORDERS_AT_4))
        found, pinned = check(runner, {ORDERS: ORDERS_AT_4})
        assert isinstance(found, Unchanged)
        assert found.reason == NO_SOURCE_COMMITS
        assert found.publication.state_version == 7 and pinned == [ORDERS]
        assert found.versions == {ORDERS: 4}
        # What a group's commit records for the member: the view as it is.
        assert found.view_sql.startswith("CREATE OR REPLACE VIEW `analytics`.`m` AS SELECT")
        assert "VERSION AS OF 7" in found.view_sql

    def test_a_view_pointed_elsewhere_takes_the_whole_path(self) -> None:
        # An ALTER VIEW by hand: the text no longer reads the version the properties name.
        runner = FakeRunner(published(ORDERS_AT_4), view_version=8)
        found, _ = check(runner, {ORDERS: ORDERS_AT_4})
        assert found == f"its view does not read {STATE} at the version its properties name"

    def test_a_change_is_found_before_the_view_text_is_read(self) -> None:
        runner = FakeRunner(published(ORDERS_AT_4))
        later = snapshot(ORDERS, *ORDERS_AT_4.recent_commits, commit(5, "2026-11-29 10:01:00.000"))
        found, _ = check(runner, {ORDERS: later})
        assert isinstance(found, str) and "version 5" in found
        assert runner.statements == [show_properties(TARGET)]

    def test_models_among_the_sources_are_left_to_the_whole_path_unpinned(self) -> None:
        found, pinned = check(FakeRunner(published(ORDERS_AT_4)), {}, way="table")
        assert found == f"it reads {ORDERS} (table), which the whole path pins"
        assert pinned == []

    def test_a_source_that_cannot_be_pinned_is_left_to_the_whole_path(self) -> None:
        def refuse(table: TableName) -> SourceSnapshot:
            raise InvalidSource("m", str(table), "is a view", "read a table")

        runner = FakeRunner(published(ORDERS_AT_4))
        found = unchanged.check(
            runner, TARGET, STATE, runner.view_properties(), KEY, refuse, lambda t: unchanged.SOURCE
        )
        assert isinstance(found, str) and "is a view" in found

    def test_the_record_is_json_a_reader_can_follow(self) -> None:
        record = json.loads(published(ORDERS_AT_4)[unchanged.SOURCES_PROPERTY])
        assert record == {"raw.orders": {"committed_at": "2026-11-29 10:00:05.000", "version": 4}}


# An upstream ivm model's view as its own publication left it (state version 3).
UPSTREAM_VIEW = {
    unchanged.KEY_PROPERTY: "its key",
    unchanged.SOURCES_PROPERTY: '{"raw.orders": {"version": 4}}',
    emit.STATE_VERSION_PROPERTY: "3",
}


def over_upstream() -> dict[str, str]:
    """The model's view, published over ORDERS and the upstream's state version 3."""
    upstream = SourceSnapshot(UPSTREAM, None, 3)
    record = unchanged.sources_property(
        [ORDERS_AT_4, upstream], [ORDERS, UPSTREAM], {UPSTREAM: UPSTREAM_VIEW}
    )
    return {**published(ORDERS_AT_4), unchanged.SOURCES_PROPERTY: record}


class TestUpstreamModels:
    def read_as(self, table: TableName) -> str:
        return unchanged.PUBLISHED if table == UPSTREAM else unchanged.SOURCE

    def check(self, runner: FakeRunner, upstream_properties: dict | None = None):
        return unchanged.check(
            runner,
            TARGET,
            STATE,
            runner.view_properties(),
            KEY,
            {ORDERS: ORDERS_AT_4}.get,
            self.read_as,
            upstream_properties,
        )

    def test_the_upstream_properties_read_are_kept_for_the_whole_path(self) -> None:
        shown = {**UPSTREAM_VIEW, emit.STATE_VERSION_PROPERTY: "4"}
        kept: dict = {}
        assert isinstance(self.check(FakeRunner(over_upstream(), upstream=shown), kept), str)
        assert kept == {UPSTREAM: shown}

    def test_an_upstream_showing_what_was_recorded_is_no_change(self) -> None:
        found = self.check(FakeRunner(over_upstream(), upstream=UPSTREAM_VIEW))
        assert isinstance(found, Unchanged)
        assert found.versions == {ORDERS: 4, UPSTREAM: 3}

    @pytest.mark.parametrize(
        "shown",
        [
            {**UPSTREAM_VIEW, emit.STATE_VERSION_PROPERTY: "4"},
            # Re-published at the same state version from other sources.
            {**UPSTREAM_VIEW, unchanged.SOURCES_PROPERTY: '{"raw.orders": {"version": 5}}'},
            {emit.STATE_VERSION_PROPERTY: "3"},
        ],
    )
    def test_an_upstream_showing_anything_else_takes_the_whole_path(self, shown) -> None:
        found = self.check(FakeRunner(over_upstream(), upstream=shown))
        assert found == f"the upstream ivm model {UPSTREAM} shows another state than recorded"

    def test_an_upstream_read_at_another_state_than_shown_records_no_digest(self) -> None:
        # A member of the same group, read at the state it had just written (4).
        staged = SourceSnapshot(UPSTREAM, None, 4)
        record = unchanged.sources_property([staged], [UPSTREAM], {UPSTREAM: UPSTREAM_VIEW})
        assert json.loads(record) == {str(UPSTREAM): {"version": 4}}

    def test_an_upstream_recorded_without_a_digest_takes_the_whole_path(self) -> None:
        # Published over an upstream whose view had no record yet.
        upstream = SourceSnapshot(UPSTREAM, None, 3)
        record = unchanged.sources_property([ORDERS_AT_4, upstream], [ORDERS, UPSTREAM], {})
        runner = FakeRunner(
            {**published(ORDERS_AT_4), unchanged.SOURCES_PROPERTY: record}, upstream=UPSTREAM_VIEW
        )
        assert isinstance(self.check(runner), str)


def test_the_compile_reuses_the_upstream_properties_the_shortcut_read() -> None:
    shown = {**UPSTREAM_VIEW, emit.STATE_PROPERTY: str(STATE)}
    runner = FakeRunner({}, upstream=shown)
    found = upstreams.upstream_models(runner, [UPSTREAM], lambda table: "view", {UPSTREAM: shown})
    assert found[UPSTREAM].state == STATE and found[UPSTREAM].published_version == 7
    assert show_properties(UPSTREAM) not in runner.statements
