"""The ivm materialization through dbt: every branch of a refresh, and every refusal.

Each test drives `dbt run`/`dbt build` in-process on the shared Spark session
and checks the outcome in Spark: the relation users query, the state table's
history, and the messages dbt shows.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture, write_file

from dbt.adapters.spark_ivm.delta.confs import LAST_COMMIT_CONF
from dbt.adapters.spark_ivm.refresh import handoff
from ivm_compiler import layout
from tests.functional.ivm_checks import (
    assert_model_matches_query,
    bag_difference,
    latest_version,
    state_builds,
)
from tests.functional.ivm_project import (
    QUERIES,
    SOURCE_DDL,
    SOURCES_YML,
    IvmProject,
    create_source,
)

models__grouped = QUERIES["grouped"].format(src="{{ source('raw', 'src') }}")
models__drops_key = QUERIES["drops_key"].format(src="{{ source('raw', 'src') }}")
models__correlated = """
select a.k, (select max(b.v) from {{ source('raw', 'src') }} b where b.k = a.k) as top_v
from {{ source('raw', 'src') }} a
"""
models__ranked_with_fallback = """
{{ config(ivm_fallback='full_refresh') }}
select k, percentile(k, 0.5) over (partition by g) as quantile from {{ source('raw', 'src') }}
"""
models__misspelled_config = """
{{ config(ivm_fallbak='full_refresh') }}
select k from {{ source('raw', 'src') }}
"""
models__schema_yml = """
version: 2
models:
  - name: grouped
    data_tests: [ivm_matches_query]
  - name: drops_key
    data_tests: [ivm_matches_query]
"""


def _messages(results) -> dict[str, str]:
    return {
        r.node.name: (r.adapter_response or {}).get("_message") or str(r.message) for r in results
    }


class TestIvmMaterialization(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "grouped.sql": models__grouped,
            "drops_key.sql": models__drops_key,
            "schema.yml": models__schema_yml,
        }

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project)

    def test_first_build_then_incremental_then_no_change(self, project, spark, source_table):
        schema = project.test_schema
        results = run_dbt(["build"])
        assert all(str(r.status) in ("success", "pass") for r in results)
        assert "first build" in _messages(results)["grouped"]

        # Only the model's columns are visible, with the query's names and types.
        view = spark.table(f"{schema}.grouped")
        query = spark.sql(QUERIES["grouped"].format(src=source_table))
        assert view.schema.simpleString() == query.schema.simpleString()
        state_columns = spark.table(f"{schema}.grouped__ivm_state").columns
        assert "__ivm_count" in state_columns and "__ivm_count" not in view.columns

        spark.sql(f"INSERT INTO {source_table} VALUES (2, 'b', 5, NULL), (1, 'a', 1, 1.50)")
        spark.sql(f"UPDATE {source_table} SET v = 7 WHERE k IS NULL")
        spark.sql(f"DELETE FROM {source_table} WHERE g = 'b'")
        results, log = run_dbt_and_capture(["--debug", "build"])
        messages = _messages(results)
        assert messages["grouped"].startswith("IVM incremental"), messages
        # The state's version after its write (a log's INSERT, ivm_state_form
        # 'auto') comes from the connection's own session (runtime/sessions.py; a
        # Thrift server's session), not its history.
        written = list(re.finditer(r"INSERT INTO \S*grouped__ivm_state", log))
        assert written, "no INSERT into the state in the log"
        after = log[written[-1].end() :]
        assert LAST_COMMIT_CONF in after
        assert not re.search(r"DESCRIBE HISTORY \S*grouped__ivm_state", after)
        for model in ("grouped", "drops_key"):
            version = assert_model_matches_query(spark, schema, model, QUERIES[model], "src")
            assert version == latest_version(spark, source_table)

        state_version = latest_version(spark, f"{schema}.grouped__ivm_state")
        results = run_dbt(["build"])
        assert _messages(results)["grouped"].startswith("IVM no changes")
        assert latest_version(spark, f"{schema}.grouped__ivm_state") == state_version, (
            "a refresh with no source changes must not write the state"
        )

    def test_full_refresh_rebuilds_at_the_latest_version(self, project, spark, source_table):
        spark.sql(f"INSERT INTO {source_table} VALUES (3, 'c', 3, 3.00)")
        results = run_dbt(["run", "--full-refresh"])
        assert "--full-refresh" in _messages(results)["grouped"]
        assert_model_matches_query(spark, project.test_schema, "grouped", QUERIES["grouped"], "src")

    def test_changed_model_sql_is_rebuilt_not_patched(self, project, spark, source_table):
        run_dbt(["run"])
        changed = QUERIES["drops_key"].replace("select g, v", "select v, g")
        write_file(
            changed.format(src="{{ source('raw', 'src') }}"),
            project.project_root,
            "models",
            "drops_key.sql",
        )
        try:
            spark.sql(f"INSERT INTO {source_table} VALUES (4, 'd', 4, NULL)")
            _, log = run_dbt_and_capture(["run", "--select", "drops_key"])
            assert "SQL or its columns changed" in log
            assert_model_matches_query(spark, project.test_schema, "drops_key", changed, "src")
        finally:
            write_file(models__drops_key, project.project_root, "models", "drops_key.sql")
            run_dbt(["run", "--select", "drops_key"])

    def _assert_rebuilt_because_changes_are_unreadable(self, project, spark, source_table):
        _, log = run_dbt_and_capture(["run", "--select", "grouped"])
        assert "rebuilding fully" in log and "can no longer be read" in log
        version = assert_model_matches_query(
            spark, project.test_schema, "grouped", QUERIES["grouped"], "src"
        )
        assert version == latest_version(spark, source_table)

    def test_change_feed_gap_rebuilds_with_a_warning(self, project, spark, source_table):
        run_dbt(["run", "--select", "grouped"])
        # Versions written while the feed is off have no change data: the next
        # refresh cannot read the window and must rebuild, never skip it.
        spark.sql(
            f"ALTER TABLE {source_table} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)"
        )
        spark.sql(f"INSERT INTO {source_table} VALUES (5, 'a', 50, NULL)")
        spark.sql(
            f"ALTER TABLE {source_table} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
        self._assert_rebuilt_because_changes_are_unreadable(project, spark, source_table)

    def test_vacuumed_change_files_rebuild_with_a_warning(self, project, spark, source_table):
        run_dbt(["run", "--select", "grouped"])
        spark.sql(f"UPDATE {source_table} SET v = v + 10 WHERE k = 1")
        spark.sql(f"DELETE FROM {source_table} WHERE k = 2")
        # VACUUM lists the table's files in as many Spark tasks as this setting
        # (default 10,000): on two cores that alone took about two minutes.
        confs = {
            "spark.databricks.delta.retentionDurationCheck.enabled": "false",
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        }
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            spark.sql(f"VACUUM {source_table} RETAIN 0 HOURS")
        finally:
            for key in confs:
                spark.conf.unset(key)
        self._assert_rebuilt_because_changes_are_unreadable(project, spark, source_table)

    def test_recreated_source_is_detected(self, project, spark, source_table):
        run_dbt(["run", "--select", "grouped"])
        spark.sql(f"DROP TABLE {source_table}")
        spark.sql(SOURCE_DDL.format(table=source_table))
        spark.sql(f"INSERT INTO {source_table} VALUES (9, 'z', 9, 9.00)")
        _, log = run_dbt_and_capture(["run", "--select", "grouped"])
        assert "dropped and recreated" in log
        assert_model_matches_query(spark, project.test_schema, "grouped", QUERIES["grouped"], "src")

    def test_tampered_state_fails_the_test_and_is_rebuilt(self, project, spark, source_table):
        run_dbt(["run"])
        view = f"{project.test_schema}.drops_key"
        before = spark.sql(f"SELECT * FROM {view}").collect()
        # Tamper with the state by hand: the view reads the published version,
        # so readers do not see it...
        spark.sql(
            f"UPDATE {project.test_schema}.drops_key__ivm_state SET __ivm_count = __ivm_count + 1"
        )
        assert Counter(spark.sql(f"SELECT * FROM {view}").collect()) == Counter(before)
        run_dbt(["test", "--select", "drops_key"])
        # ...until something points the view at the tampered version: then the
        # generic test must catch it...
        text = next(
            r["data_type"]
            for r in spark.sql(f"DESCRIBE TABLE EXTENDED {view}").collect()
            if r["col_name"] == "View Text"
        )
        published = int(text.split("VERSION AS OF ")[1].split()[0])
        tampered = text.replace(f"VERSION AS OF {published}", f"VERSION AS OF {published + 1}")
        spark.sql(f"ALTER VIEW {view} AS {tampered}")
        results = run_dbt(["test", "--select", "drops_key"], expect_pass=False)
        failed = [r for r in results if str(r.status) == "fail"]
        assert len(failed) == 1 and failed[0].failures == 1
        # ...and the next refresh sees a write that is not its own and rebuilds.
        _, log = run_dbt_and_capture(["run", "--select", "drops_key"])
        assert "written outside dbt after its last refresh (UPDATE at version" in log
        run_dbt(["test", "--select", "drops_key"])


class TestRefusalsAndFallbacks(IvmProject):
    # In the Thrift slice of the README's test command: refusals and fallback tables through a
    # server session.
    thrift_slice = True

    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "correlated.sql": models__correlated,
            "ranked.sql": models__ranked_with_fallback,
            "misspelled.sql": models__misspelled_config,
            "from_view.sql": "select k from {{ ref('plain_view') }}",
            "plain_view.sql": "{{ config(materialized='view') }} select k from {{ source('raw', 'src') }}",
        }

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project, "(1, 'a', 1, 1.50), (2, 'a', 2, NULL)")

    def test_unsupported_query_fails_before_any_sql_runs(self, project, spark, source_table):
        results = run_dbt(["run", "--select", "correlated"], expect_pass=False)
        message = str(results[0].message)
        assert "model.test.correlated" in message
        assert (
            "a scalar subquery, or EXISTS/IN outside the WHERE clause is not supported" in message
        )
        assert "Fix: write it as a JOIN" in message
        tables = {r.tableName for r in spark.sql(f"SHOW TABLES IN {project.test_schema}").collect()}
        assert not {"correlated", "correlated__ivm_state"} & tables

    def test_fallback_recomputes_with_a_warning(self, project, spark, source_table):
        _, log = run_dbt_and_capture(["run", "--select", "ranked"])
        assert "recomputing fully because ivm_fallback='full_refresh'" in log
        assert "the window function PERCENTILE" in log
        rows = spark.sql(f"SELECT * FROM {project.test_schema}.ranked").count()
        assert rows == spark.table(source_table).count()

    def test_misspelled_config_is_named(self, project, source_table):
        results = run_dbt(["run", "--select", "misspelled"], expect_pass=False)
        message = str(results[0].message)
        assert "ivm_fallbak" in message and "did you mean 'ivm_fallback'" in message

    def test_source_without_change_feed_shows_the_fix(self, project, spark, source_table):
        model = "select k from {{ source('raw', 'src') }}"
        write_file(model, project.project_root, "models", "plain_ivm.sql")
        spark.sql(
            f"ALTER TABLE {source_table} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)"
        )
        try:
            results = run_dbt(["run", "--select", "plain_ivm"], expect_pass=False)
            message = str(results[0].message)
            assert "model.test.plain_ivm" in message
            assert "does not have the Delta change data feed enabled" in message
            assert "SET TBLPROPERTIES (delta.enableChangeDataFeed = true)" in message
        finally:
            spark.sql(
                f"ALTER TABLE {source_table} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )

    def test_source_that_is_a_view_is_refused(self, project, source_table):
        run_dbt(["run", "--select", "plain_view"])
        results = run_dbt(["run", "--select", "from_view"], expect_pass=False)
        message = str(results[0].message)
        assert "model.test.from_view" in message and "Delta table" in message


class TestFallbackChain(IvmProject):
    """A refused model built by ivm_fallback, an ivm model over it, and one over that.

    The fallback table is written in place with its difference
    (refresh/fallback.py), so both readers apply its change and are never
    computed whole again. Session mode only in the README's test command:
    test_random_handoff.py (extended) runs the same hand-on under random
    sequences in both modes, and TestRefusalsAndFallbacks covers the fallback
    over Thrift.
    """

    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "ranked.sql": models__ranked_with_fallback,
            "over_ranked.sql": (
                "select quantile, count(*) as n, sum(k) as sk from {{ ref('ranked') }} "
                "group by quantile"
            ),
            "over_over.sql": "select sum(n) as n from {{ ref('over_ranked') }}",
        }

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project, "(1, 'a', 1, 1.50), (2, 'a', 2, NULL)")

    @staticmethod
    def reader_queries(schema: str) -> dict[str, str]:
        """The queries of the two ivm levels over the fallback table."""
        return {
            "over_ranked": (
                f"SELECT quantile, count(*) AS n, sum(k) AS sk FROM {schema}.ranked "
                "GROUP BY quantile"
            ),
            "over_over": f"SELECT sum(n) AS n FROM {schema}.over_ranked",
        }

    def test_ivm_models_over_a_fallback_model_stay_equal_to_their_queries(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        chain = ["ranked", "over_ranked", "over_over"]
        queries = self.reader_queries(schema)
        run_dbt(["run", "--select", *chain])
        for batch in range(3):
            spark.sql(f"INSERT INTO {source_table} VALUES ({10 + batch}, 'b', {batch}, 1.00)")
            spark.sql(f"DELETE FROM {source_table} WHERE k = {batch}")
            results, log = run_dbt_and_capture(["run", "--select", *chain])
            responses = {r.node.name: r.adapter_response for r in results}
            # Written in place as its difference, which its readers apply.
            assert "handed on as the rows that differ (a MERGE)" in responses["ranked"]["_message"]
            assert "built as a table by ivm_fallback" not in log, log
            for model, query in queries.items():
                assert responses[model]["code"] == "INCREMENTAL", (model, responses[model])
                assert state_builds(spark, schema, model) == 1, f"{model} was computed whole again"
                difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
                assert difference.equal, f"{model} after batch {batch}: {difference}"

    def test_a_large_difference_overwrites_the_table_and_its_readers_stay_equal(
        self, project, spark, source_table, monkeypatch
    ):
        # Every difference counts as large (handoff.MERGED_CHANGE_ROWS): the
        # table is overwritten, and its readers read that as their change.
        monkeypatch.setattr(handoff, "MERGED_CHANGE_ROWS", 1)
        schema = project.test_schema
        queries = self.reader_queries(schema)
        chain = ["run", "--select", "ranked", "over_ranked", "over_over"]
        run_dbt(chain)  # built, if the test before did not build them
        spark.sql(f"INSERT INTO {source_table} VALUES (20, 'a', 5, 1.00), (21, 'b', 6, NULL)")
        results = run_dbt(chain)
        responses = {r.node.name: r.adapter_response for r in results}
        assert "handed on as an overwrite" in responses["ranked"]["_message"], responses
        assert "the table overwritten" in responses["ranked"]["_message"], responses
        # The overwrite's commit records the difference's size, by which its readers
        # decide how to apply it without summing the table first.
        inserted, deleted = (
            int(n)
            for n in re.search(r"\(\+(\d+) -(\d+) rows", responses["ranked"]["_message"]).groups()
        )
        metadata = spark.sql(f"DESCRIBE HISTORY {schema}.ranked LIMIT 1").first()["userMetadata"]
        assert json.loads(metadata)["estimated_change_rows"] == inserted + deleted > 0
        # Written from its unchanged rows and the difference's new copies, the
        # table equals its query (its readers' queries read the table itself).
        ranked = (
            f"SELECT k, percentile(k, 0.5) OVER (PARTITION BY g) AS quantile FROM {source_table}"
        )
        difference = bag_difference(spark, f"SELECT * FROM {schema}.ranked", ranked)
        assert difference.equal, f"ranked after its overwrite: {difference}"
        # Read as a change, the overwrite's deleted and inserted rows summed.
        for model, query in queries.items():
            assert responses[model]["code"] == "INCREMENTAL", responses[model]
            assert state_builds(spark, schema, model) == 1, f"{model} was built again"
            difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
            assert difference.equal, f"{model}: {difference}"

    def test_a_large_difference_into_a_table_with_deletion_vectors_is_merged(
        self, project, spark, source_table, monkeypatch
    ):
        # Every difference large and every table large enough for deletion
        # vectors: turned on, the difference is merged, not overwritten.
        monkeypatch.setattr(handoff, "MERGED_CHANGE_ROWS", 1)
        monkeypatch.setattr(layout, "DELETION_VECTOR_STATE_BYTES", 0)
        schema = project.test_schema
        chain = ["run", "--select", "ranked", "over_ranked", "over_over"]
        run_dbt(chain)  # built, if the tests before did not build them
        spark.sql(f"INSERT INTO {source_table} VALUES (30, 'a', 7, 1.00), (31, 'b', 8, NULL)")
        results = run_dbt(chain)
        responses = {r.node.name: r.adapter_response for r in results}
        message = responses["ranked"]["_message"]
        assert "into a table with deletion vectors" in message, message
        assert "(a MERGE)" in message and "written in place" in message, message
        properties = {
            r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {schema}.ranked").collect()
        }
        assert properties.get("delta.enableDeletionVectors") == "true", properties
        last = spark.sql(f"DESCRIBE HISTORY {schema}.ranked LIMIT 1").first()
        assert last["operation"] == "MERGE", last["operation"]
        # Its change feed is the difference alone: as many rows as the message counts.
        inserted, deleted = (int(n) for n in re.search(r"\(\+(\d+) -(\d+) rows", message).groups())
        feed = spark.sql(
            f"SELECT count(*) AS n FROM table_changes('{schema}.ranked', {last['version']}, "
            f"{last['version']}) WHERE _change_type IN ('insert', 'delete')"
        ).first()["n"]
        assert feed == inserted + deleted > 0, (feed, message)
        for model, query in self.reader_queries(schema).items():
            assert responses[model]["code"] == "INCREMENTAL", responses[model]
            assert state_builds(spark, schema, model) == 1, f"{model} was built again"
            difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
            assert difference.equal, f"{model}: {difference}"


class TestFallbackOverAnUnpublishedUpstream(IvmProject):
    """A fallback model over an ivm model whose consistency group has not published yet.

    `kept` and `kept_peer` form group 'silver', which publishes once both
    have refreshed; `kept_peer` reads the fallback table, so dbt runs the
    fallback after `kept` has refreshed and before 'silver' publishes, when
    `kept`'s view still shows the previous run (on the warehouse with 4
    threads the refused model ran before silver's commit in the same way).
    The fallback reads `kept`'s staged state instead, so it equals its query
    once the run is over, and its reader in group 'gold' publishes after
    'silver', whose unpublished state the table was written from.
    """

    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "kept.sql": (
                "{{ config(ivm_group='silver') }}\n"
                "select k, g from {{ source('raw', 'src') }} where k is not null"
            ),
            "ranked_kept.sql": (
                "{{ config(ivm_fallback='full_refresh', ivm_group='gold') }}\n"
                "select k, percentile(k, 0.5) over (partition by g) as quantile "
                "from {{ ref('kept') }}"
            ),
            "kept_peer.sql": (
                "{{ config(ivm_group='silver') }}\n"
                "select quantile, max(k) as top from {{ ref('ranked_kept') }} group by quantile"
            ),
            "over_ranked_kept.sql": (
                "{{ config(ivm_group='gold') }}\n"
                "select quantile, count(*) as n from {{ ref('ranked_kept') }} group by quantile"
            ),
        }

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project, "(1, 'a', 1, 1.50), (2, 'a', 2, NULL)")

    def test_the_fallback_reads_the_upstream_state_its_group_is_about_to_publish(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        queries = {
            "ranked_kept": (
                f"SELECT k, percentile(k, 0.5) OVER (PARTITION BY g) AS quantile FROM {schema}.kept"
            ),
            "over_ranked_kept": (
                f"SELECT quantile, count(*) AS n FROM {schema}.ranked_kept GROUP BY quantile"
            ),
            "kept_peer": (
                f"SELECT quantile, max(k) AS top FROM {schema}.ranked_kept GROUP BY quantile"
            ),
        }
        run_dbt(["run"])
        for batch in range(2):
            spark.sql(f"INSERT INTO {source_table} VALUES ({10 + batch}, 'a', {batch}, 1.00)")
            spark.sql(f"DELETE FROM {source_table} WHERE k = {batch + 1}")
            results, log = run_dbt_and_capture(["--debug", "run"])
            responses = {r.node.name: r.adapter_response for r in results}
            assert responses["ranked_kept"]["code"] == "FALLBACK", responses["ranked_kept"]
            assert f"reads {schema}.kept at its state refreshed in this run" in log, log
            assert "'gold' publishes after 'silver'" in log, log
            for model, query in queries.items():
                difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
                assert difference.equal, f"{model} after batch {batch}: {difference}"


models__documented_yml = """
version: 2
models:
  - name: documented
    description: Rows per group, kept incrementally
    config:
      persist_docs: {relation: true, columns: true}
    columns:
      - name: g
        description: The group's name
"""


class TestPersistDocs(IvmProject):
    # In the Thrift slice of the README's test command: view comments and ALTER VIEW over Thrift.
    thrift_slice = True

    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "documented.sql": "select g, count(*) as n from {{ source('raw', 'src') }} group by g",
            "documented.yml": models__documented_yml,
        }

    def test_descriptions_reach_the_view(self, project, spark):
        create_source(project, "(1, 'a', 1, 1.50)")
        run_dbt(["run"])
        view = f"{project.test_schema}.documented"
        described = {r.col_name: r for r in spark.sql(f"DESCRIBE TABLE EXTENDED {view}").collect()}
        assert described["g"].comment == "The group's name"
        assert described["Comment"].data_type == "Rows per group, kept incrementally"
        # The view is recreated on every run, so an edited description shows up.
        write_file(
            models__documented_yml.replace("The group's name", "Group name, edited"),
            project.project_root,
            "models",
            "documented.yml",
        )
        run_dbt(["run"])
        described = {r.col_name: r for r in spark.sql(f"DESCRIBE TABLE EXTENDED {view}").collect()}
        assert described["g"].comment == "Group name, edited"
