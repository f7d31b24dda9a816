"""Consistency groups from dbt's graph: who publishes with whom (pure Python)."""

from __future__ import annotations

import logging

from dbt.adapters.spark_ivm.consistency.groups import (
    GroupRun,
    Staged,
    consistency_groups,
    members_from_graph,
    why_grouped,
)
from ivm_compiler import TableName


def _graph() -> dict:
    def model(name, parents, materialized="ivm", **config):
        return {
            "resource_type": "model",
            "name": name,
            "alias": name,
            "schema": "marts",
            "config": {"materialized": materialized, **config},
            "depends_on": {"nodes": parents},
        }

    return {
        "sources": {
            "source.p.raw.orders": {"schema": "raw", "identifier": "orders", "name": "orders"},
            "source.p.raw.customers": {"schema": "raw", "identifier": "customers"},
            "source.p.raw.events": {"schema": "raw", "identifier": "events"},
        },
        "nodes": {
            "model.p.revenue": model("revenue", ["source.p.raw.orders"]),
            "model.p.by_segment": model(
                "by_segment", ["source.p.raw.orders", "source.p.raw.customers"]
            ),
            # Reads an ivm model of the group: joins it through that relation.
            "model.p.segment_totals": model("segment_totals", ["model.p.by_segment"]),
            "model.p.clicks": model("clicks", ["source.p.raw.events"]),
            "model.p.dim": model("dim", ["source.p.raw.customers"], materialized="table"),
            "model.p.over_dim": model("over_dim", ["model.p.dim"]),
            "model.p.dim_too": model("dim_too", ["model.p.dim"], ivm_group="none"),
            "test.p.some_test": {"resource_type": "test", "config": {}},
        },
    }


def test_members_are_the_selected_ivm_models_with_what_they_read() -> None:
    graph = _graph()
    members = {m.name: m for m in members_from_graph(graph, list(graph["nodes"]))}
    assert sorted(members) == [
        "by_segment",
        "clicks",
        "dim_too",
        "over_dim",
        "revenue",
        "segment_totals",
    ]
    assert members["by_segment"].inputs == {"raw.orders", "raw.customers"}
    assert members["segment_totals"].input_kinds == (("marts.by_segment", "ivm"),)
    assert members["over_dim"].input_kinds == (("marts.dim", "table"),)
    assert members["revenue"].relation == TableName(db="marts", name="revenue")


def test_groups_follow_shared_sources_and_ivm_parents() -> None:
    graph = _graph()
    groups = consistency_groups(members_from_graph(graph, list(graph["nodes"])))
    named = {g.name: sorted(m.name for m in g.members) for g in groups.values()}
    assert named == {
        # orders is shared by revenue and by_segment; segment_totals reads by_segment.
        "segment_totals": ["by_segment", "revenue", "segment_totals"],
        "clicks": ["clicks"],
        "over_dim": ["over_dim"],
        # Opted out, though it shares marts.dim with over_dim.
        "dim_too": ["dim_too"],
    }
    group = groups["model.p.revenue"]
    # Pinned together: the sources, not the group's own members.
    assert group.base_inputs == {"raw.orders": "source", "raw.customers": "source"}


def test_only_the_selection_forms_groups() -> None:
    graph = _graph()
    groups = consistency_groups(members_from_graph(graph, ["model.p.revenue", "model.p.clicks"]))
    assert sorted(m.name for m in groups["model.p.revenue"].members) == ["revenue"]


def test_a_named_group_holds_unrelated_models() -> None:
    graph = _graph()
    graph["nodes"]["model.p.clicks"]["config"]["ivm_group"] = "dashboards"
    graph["nodes"]["model.p.over_dim"]["config"]["ivm_group"] = "dashboards"
    groups = consistency_groups(members_from_graph(graph, list(graph["nodes"])))
    assert sorted(m.name for m in groups["model.p.clicks"].members) == ["clicks", "over_dim"]
    assert groups["model.p.clicks"].name == "dashboards"


def test_why_a_model_is_in_its_group_names_shared_inputs_readers_or_its_config() -> None:
    graph = _graph()
    graph["nodes"]["model.p.clicks"]["config"]["ivm_group"] = "dashboards"
    groups = consistency_groups(members_from_graph(graph, list(graph["nodes"])))

    def why(model: str) -> list[str]:
        return why_grouped(groups[f"model.p.{model}"], f"model.p.{model}")

    assert why("by_segment") == ["reads raw.orders, as revenue does", "is read by segment_totals"]
    assert why("segment_totals") == ["reads by_segment, a member"]
    assert why("revenue") == ["reads raw.orders, as by_segment does"]
    assert why("clicks") == [
        "has ivm_group: dashboards (in its config, or its folder's +ivm_group)"
    ]
    assert why("dim_too") == ["has ivm_group: none, which keeps it on its own"]
    assert why("over_dim") == ["shares no input with another selected ivm model"]


def _staged(model_id: str) -> Staged:
    return Staged(
        model_id=model_id,
        relation=TableName("marts", model_id),
        state=TableName("marts", model_id + "__ivm_state"),
        state_version=2,
        view_sql="",
        action="incremental",
        seconds=0.0,
        source_versions={},
    )


def test_a_group_is_complete_when_every_member_staged_or_withdrew() -> None:
    graph = _graph()
    run = GroupRun("inv", consistency_groups(members_from_graph(graph, list(graph["nodes"]))))
    progress = run.progress("model.p.revenue")
    assert progress is run.progress("model.p.by_segment")
    for model_id in ("model.p.revenue", "model.p.by_segment"):
        assert not progress.complete
        progress.staged[model_id] = _staged(model_id)
    assert not progress.complete
    progress.withdrawn.add("model.p.segment_totals")
    assert progress.complete
    progress.failed = "model.p.revenue"
    assert not progress.complete


def test_a_member_whose_view_did_not_move_says_why_in_its_result() -> None:
    from dbt.adapters.spark_ivm.consistency.publish import Publisher

    graph = _graph()
    run = GroupRun("inv", consistency_groups(members_from_graph(graph, list(graph["nodes"]))))

    def publisher(model_id: str) -> Publisher:
        # No statement may run: nothing is committed while the group waits or has failed.
        return Publisher(
            runner=None,  # type: ignore[arg-type]
            log=logging.getLogger("test"),
            model=model_id,
            commit_log=TableName("marts", "ivm_group_commits"),
            group_run=run,
            progress=run.progress(model_id),
        )

    waiting = publisher("model.p.revenue").publish(_staged("model.p.revenue"))
    assert waiting is not None and waiting.startswith("not yet shown: consistency group")
    assert "when 2 more member(s) have refreshed" in waiting
    publisher("model.p.by_segment").fail(RuntimeError("boom"))
    withheld = publisher("model.p.segment_totals").publish(_staged("model.p.segment_totals"))
    assert withheld is not None and withheld.startswith("withheld: consistency group")
    assert "as model.p.by_segment failed" in withheld
