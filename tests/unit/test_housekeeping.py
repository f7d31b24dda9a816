"""Orphaned ivm relations: which tables and views no ivm model owns (pure Python)."""

from __future__ import annotations

from dbt.adapters.spark_ivm.operations.housekeeping import (
    Relation,
    find_orphans,
    ivm_models,
    model_schemas,
    owner_of,
    report,
)
from ivm_compiler import TableName

GRAPH = {
    "nodes": {
        "model.p.kept": {
            "resource_type": "model",
            "schema": "Analytics",
            "name": "kept",
            "alias": "kept",
            "config": {"materialized": "ivm"},
        },
        "model.p.now_a_table": {
            "resource_type": "model",
            "schema": "analytics",
            "name": "now_a_table",
            "config": {"materialized": "table"},
        },
        "test.p.t": {"resource_type": "test", "schema": "analytics_dbt_test__audit"},
    }
}


def _t(name: str) -> TableName:
    return TableName("analytics", name)


def test_the_project_s_ivm_models_and_schemas():
    assert ivm_models(GRAPH) == {("analytics", "kept")}
    assert model_schemas(GRAPH) == {"Analytics", "analytics"}


def test_owner_is_the_name_before_the_reserved_infix():
    assert owner_of(_t("orders__ivm_state")) == _t("orders")
    assert owner_of(_t("orders__ivm_join_o")) == _t("orders")
    assert owner_of(_t("orders")) is None
    assert owner_of(_t("__ivm_state")) is None


def test_only_auxiliary_tables_of_non_ivm_models_and_their_views_are_orphans():
    relations = [
        Relation(_t("kept"), "view"),
        Relation(_t("kept__ivm_state"), "table"),
        Relation(_t("renamed"), "view"),
        Relation(_t("renamed__ivm_state"), "table"),
        Relation(_t("now_a_table"), "table"),
        Relation(_t("now_a_table__ivm_state"), "table"),
        Relation(_t("unrelated"), "table"),
        Relation(_t("ivm_group_commits"), "table"),
    ]
    state_read_by = {
        _t("kept"): _t("kept__ivm_state"),
        _t("renamed"): _t("renamed__ivm_state"),
    }
    orphans = find_orphans(relations, ivm_models(GRAPH), state_read_by)
    assert [(o.relation.kind, o.relation.name.name) for o in orphans] == [
        ("table", "now_a_table__ivm_state"),
        ("table", "renamed__ivm_state"),
        ("view", "renamed"),
    ]
    text = report(orphans, dropped=False)
    assert "found 3 relation(s)" in text and "drop: true" in text
    assert "dropped 3" in report(orphans, dropped=True)
    assert report([], dropped=False) == "ivm_orphans: no orphaned ivm relations"
