"""The harness's pure parts, without Spark: batch planning and the report's verdicts."""

from __future__ import annotations

import pytest
from tpch_bench import report
from tpch_bench.batches import ORDER_KEY_SHIFT, plan_batches


def test_rf_batches_use_fresh_parts_and_free_key_slots():
    batches = plan_batches(("rf",), (0.1, 1.0, 10.0), 3)
    assert [len(b.insert_parts) for b in batches] == [1, 1, 1, 10, 10, 10, 100, 100, 100]
    inserted = [part for b in batches for part in b.insert_parts]
    deleted = [part for b in batches for part in b.delete_parts]
    assert len(inserted) == len(set(inserted)) == len(deleted) == len(set(deleted)) == 333
    # No part is both copied and deleted: a batch inserting copies of the rows it
    # deletes would leave key-blind aggregates unchanged and prove nothing.
    assert not set(inserted) & set(deleted)
    # tpchgen-cli's order keys use residues 0-7 modulo 32: a shift of 8 is free.
    assert {b.insert_key_shift for b in batches} == {ORDER_KEY_SHIFT}
    assert [b.repetition for b in batches[:3]] == [0, 1, 2]


def test_rf_batches_that_would_share_parts_are_refused_before_running():
    plan_batches(("rf",), (25.0,), 2)  # 500 parts each way: the limit
    with pytest.raises(ValueError, match="need 1010 of the 1000 parts"):
        plan_batches(("rf",), (25.0, 0.5), 2)


def test_update_batches_change_no_parts_and_differ_by_salt():
    batches = plan_batches(("lineitem_updates", "customer_updates"), (1.0,), 2)
    assert all(not b.insert_parts and not b.delete_parts for b in batches)
    assert len({b.update_salt for b in batches}) == 4
    assert batches[0].update_threshold == 10_000  # 1 % of 1,000,000 hash buckets


def _results(batch_changes: dict, action: str, model_reads: list[str]) -> dict:
    run = {
        "model": "m",
        "way": "ivm",
        "phase": "batch",
        "ok": True,
        "action": action,
        "message": "",
        "batch_sequence": 1,
    }
    scale = {
        "scale_factor": 1,
        "checks": [],
        "models": [{"model": "m", "table_error": None, "ivm_error": None}],
        "batches": [{"sequence": 1, "changes": batch_changes}],
        "runs": [run],
    }
    return {"settings": {"model_reads": {"m": model_reads}}, "scales": [scale]}


@pytest.mark.parametrize(
    ("changes", "action", "reads", "flagged"),
    [
        ({"lineitem": {"insert": 5}}, "INCREMENTAL", ["lineitem"], False),
        ({"lineitem": {"insert": 5}}, "REBUILD", ["lineitem"], True),
        ({"lineitem": {"insert": 5}}, "RECOMPUTE", ["lineitem"], False),
        ({"customer": {"update_postimage": 2}}, "NO_CHANGE", ["lineitem"], False),
        ({"customer": {"update_postimage": 2}}, "INCREMENTAL", ["lineitem"], True),
        ({"customer": {}}, "NO_CHANGE", ["customer"], False),
    ],
    ids=[
        "incremental",
        "rebuild",
        "auto-recompute",
        "untouched",
        "untouched-but-refreshed",
        "empty-batch",
    ],
)
def test_the_report_expects_incremental_only_when_a_source_changed(changes, action, reads, flagged):
    assert bool(report.problems(_results(changes, action, reads))) is flagged


def test_a_compiler_refusal_is_reported_not_failed():
    results = _results({}, "NO_CHANGE", ["lineitem"])
    refusal = "Model 'x' cannot be maintained incrementally: LEFT JOIN ..."
    results["scales"][0]["models"][0]["ivm_error"] = refusal
    assert report.problems(results) == []
    results["scales"][0]["models"][0]["ivm_error"] = "Runtime Error: out of memory"
    assert report.problems(results) == ["SF 1: m ivm failed: Runtime Error: out of memory"]


def test_the_profile_sums_each_node_s_statements_by_kind():
    from tpch_bench.profile import profile, render, statements

    log = [
        '\x1b[0m12:00:00.000001 [debug] [Thread-1 ]: On model.b.q01_ivm: /* {"app": "dbt"} */\n',
        "MERGE INTO `s`.`q01_ivm__ivm_state` AS t\n",
        "USING (SELECT 1) AS d ON true\n",
        "\x1b[0m12:00:00.000002 [debug] [Thread-2 ]: On model.b.q01_table: select 1\n",
        "\x1b[0m12:00:02.000000 [debug] [Thread-1 ]: SQL status: OK in 2.500 seconds\n",
        "\x1b[0m12:00:02.100000 [debug] [Thread-2 ]: SQL status: OK in 0.500 seconds\n",
        "\x1b[0m12:00:02.200000 [debug] [Thread-1 ]: On model.b.q01_ivm: ALTER VIEW `s`.`v` AS SELECT 1\n",
        "\x1b[0m12:00:02.300000 [debug] [Thread-1 ]: SQL status: OK in 0.250 seconds\n",
        "\x1b[0m12:00:02.400000 [debug] [Thread-1 ]: On model.b.q01_ivm: DESCRIBE HISTORY `s`.`x` LIMIT 1\n",
        "\x1b[0m12:00:02.500000 [debug] [Thread-1 ]: SQL status: OK in 0.125 seconds\n",
        "\x1b[0m12:00:02.600000 [debug] [Thread-1 ]: On model.b.q01_ivm: SET k=v\n",
    ]
    found = statements(log)
    assert [s.kind for s in found] == [
        "MERGE",
        "SELECT",
        "ALTER VIEW ... AS",
        "DESCRIBE HISTORY",
        "SET",
    ]
    assert "USING (SELECT 1)" in found[0].sql
    (ivm,) = profile(found, nodes=("q01_ivm",))
    assert ivm.total == 2.875
    assert dict(ivm.by_kind) == {
        "MERGE": [2.5],
        "ALTER VIEW ... AS": [0.25],
        "DESCRIBE HISTORY": [0.125],
    }
    assert render([ivm]).splitlines()[1].split()[:2] == ["MERGE", "x1"]
