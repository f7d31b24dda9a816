"""The no-change shortcut (refresh/unchanged.py) through dbt: when it answers, and when it must not.

Two models in one consistency group over two sources, and a third in a
group of its own over one of them. A refresh with no source change reads
the views' records and the sources' pins only (no DESCRIBE QUERY, no
history of a state); a compaction keeps it; a change, a re-created source,
edited SQL and changed settings take the whole path, and so does the
downstream model once its upstream shows another state; a group commit
made while one member took the shortcut records that member at the state
its view shows.
"""

from __future__ import annotations

import json
import re

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture, write_file

from dbt.adapters.spark_ivm.consistency.strict import committed_select
from tests.functional.ivm_checks import assert_model_matches_query, bag_difference
from tests.functional.ivm_project import (
    QUERIES,
    SOURCE_DDL,
    SOURCES_YML,
    IvmProject,
    create_source,
)

SHORTCUT = "unchanged since its view's publication"
TAG_COUNTS = "select g, count(*) as n, sum(v) as sv from {src} group by g"


def model_file(query: str, config: str = "ivm_group='pair'") -> str:
    return f"{{{{ config({config}) }}}}\n" + query.format(src="{{ source('raw', 'src') }}")


def tag_counts_file(config: str = "ivm_group='pair'") -> str:
    return f"{{{{ config({config}) }}}}\n" + TAG_COUNTS.format(src="{{ source('raw', 'tag') }}")


# `grouped` with one more column (the SQL edit of the tests below).
EDITED_GROUPED = QUERIES["grouped"].replace("count(*) as n,", "count(*) as n, max(k) as mk,")
# An ivm model over the ivm model `grouped`, in a consistency group of its own.
OVER_GROUPED = "select g, n * 2 as n2, sv from {upstream}"


def messages(results) -> dict[str, str]:
    return {r.node.name: (r.adapter_response or {}).get("_message", "") for r in results}


def shortcuts(log: str) -> set[str]:
    """The models whose refresh the shortcut answered, from a --debug log."""
    return set(re.findall(rf"model\.test\.(\w+): {SHORTCUT}", log))


class TestNoChangeShortcut(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        return {
            "sources.yml": SOURCES_YML,
            "grouped.sql": model_file(QUERIES["grouped"]),
            "tag_counts.sql": tag_counts_file(),
            "over_grouped.sql": "{{ config(ivm_group='downstream') }}\n"
            + OVER_GROUPED.format(upstream="{{ ref('grouped') }}"),
        }

    @pytest.fixture(scope="class")
    def sources(self, project):
        tag = f"{project.test_schema}.tag"
        project.run_sql(SOURCE_DDL.format(table=tag))
        project.run_sql(f"INSERT INTO {tag} VALUES (1, 'a', 1, NULL), (2, 'b', NULL, 2.00)")
        return create_source(project), tag

    def check_models(self, project, spark, grouped: str = QUERIES["grouped"]) -> None:
        schema = project.test_schema
        assert_model_matches_query(spark, schema, "grouped", grouped, "src")
        assert_model_matches_query(spark, schema, "tag_counts", TAG_COUNTS, "tag")
        over = OVER_GROUPED.format(upstream=f"{schema}.grouped")
        assert bag_difference(spark, f"SELECT * FROM {schema}.over_grouped", over).equal

    def test_no_change_reads_only_the_views_and_the_pins(self, project, spark, sources):
        run_dbt(["run"])
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"grouped", "tag_counts", "over_grouped"}
        assert "DESCRIBE QUERY" not in log
        assert not re.search(r"DESCRIBE HISTORY \S+__ivm_state", log), "a state's history was read"
        self.check_models(project, spark)

    def test_a_compaction_keeps_the_shortcut(self, project, spark, sources):
        src, _ = sources
        spark.sql(f"OPTIMIZE {src}")
        results, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"grouped", "tag_counts", "over_grouped"}
        assert "only commits that keep the rows" in messages(results)["grouped"]
        self.check_models(project, spark)

    def test_a_group_commit_records_the_member_the_shortcut_answered(self, project, spark, sources):
        _, tag = sources
        spark.sql(f"INSERT INTO {tag} VALUES (3, 'a', 5, 1.00)")
        results, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"grouped", "over_grouped"}
        assert messages(results)["tag_counts"].startswith("IVM incremental")
        assert "consistency group 'pair' committed" in log
        # The commit names `grouped` at the state its view shows, and a strict
        # read of it (ivm_committed) reads the same rows as the view.
        commit_log = f"{project.test_schema}.ivm_group_commits"
        row = spark.sql(
            f"SELECT to_json(members) AS members FROM {commit_log} WHERE kind = 'commit' "
            "ORDER BY committed_at DESC LIMIT 1"
        ).collect()[0]
        member = next(m for m in json.loads(row["members"]) if m["model"] == "model.test.grouped")
        assert member["action"] == "no_change"
        view = f"{project.test_schema}.grouped"
        strict = f"SELECT * FROM {committed_select(member['view_sql'])}"
        assert bag_difference(spark, strict, f"SELECT * FROM {view}").equal
        self.check_models(project, spark)

    def test_a_downstream_model_follows_its_upstream(self, project, spark, sources):
        src, _ = sources
        spark.sql(f"INSERT INTO {src} VALUES (9, 'a', 2, 2.00)")
        results, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"tag_counts"}
        assert "model.test.over_grouped: taking the whole refresh path: the upstream" in log
        assert messages(results)["over_grouped"].startswith("IVM incremental")
        self.check_models(project, spark)

    def test_edited_sql_and_settings_take_the_whole_path(self, project, spark, sources):
        edited = EDITED_GROUPED
        write_file(model_file(edited), project.project_root, "models", "grouped.sql")
        write_file(
            tag_counts_file("ivm_group='pair', ivm_strategy='recompute'"),
            project.project_root,
            "models",
            "tag_counts.sql",
        )
        results, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == set()
        assert "SQL or its columns changed" in messages(results)["grouped"]
        # Its state's meaning changed (a column added): replaced, and its reader rebuilt.
        assert messages(results)["over_grouped"].startswith("IVM rebuild")
        # Other settings, same state: nothing to do, and the record is
        # written so that the next run takes the shortcut again.
        assert messages(results)["tag_counts"].startswith("IVM no changes")
        assert_model_matches_query(spark, project.test_schema, "grouped", edited, "src")
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"grouped", "tag_counts", "over_grouped"}

    def test_a_source_recreated_to_the_recorded_version_rebuilds_in_place(
        self, project, spark, sources
    ):
        # `grouped` keeps the SQL the test above edited.
        src, _ = sources
        recorded = spark.sql(f"DESCRIBE HISTORY {src} LIMIT 1").collect()[0]["version"]
        spark.sql(f"DROP TABLE {src}")
        create_source(project)
        while spark.sql(f"DESCRIBE HISTORY {src} LIMIT 1").collect()[0]["version"] < recorded:
            spark.sql(f"UPDATE {src} SET v = v WHERE k = 1")
        assert spark.sql(f"DESCRIBE HISTORY {src} LIMIT 1").collect()[0]["version"] == recorded
        results, log = run_dbt_and_capture(["--debug", "run"])
        assert shortcuts(log) == {"tag_counts"}
        assert "dropped and recreated" in messages(results)["grouped"]
        # grouped's rebuild keeps its state's meaning, so it is written in place
        # (refresh/handoff.py) and its reader applies what it changed.
        assert "its change handed on" in messages(results)["grouped"]
        assert messages(results)["over_grouped"].startswith("IVM incremental")
        self.check_models(project, spark, grouped=EDITED_GROUPED)
