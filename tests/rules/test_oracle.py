"""(+) in Python: the rule the property tests hold the compiler's MERGE and delta to.

emit.merge_changes documents what its MERGE does with each column rule;
oracle.apply_changes says the same over rows, and these tests pin it on
plans the compiler makes.
"""

from __future__ import annotations

from ivm_compiler import ViewPlan, names
from ivm_compiler.plan import MergeRule
from tests.rules.models import MODELS
from tests.rules.oracle import apply_changes, compiled


def _plan(name: str) -> ViewPlan:
    return compiled(next(m for m in MODELS if m.name == name))


def test_apply_changes_adds_deletes_emptied_rows_and_inserts_new_ones() -> None:
    plan = _plan("grouped")  # by g: count, non-NULL counts and sums of v and d
    (sum_v,) = [c.name for c in plan.state_columns if c.rule is MergeRule.ADD_NULLABLE][:1]
    row = {c: 0 for c in plan.merge_keys + tuple(c.name for c in plan.state_columns)}
    a = {**row, "__ivm_g0": "a", names.COUNT: 2, sum_v: None}
    b = {**row, "__ivm_g0": "b", names.COUNT: 1}
    changes = [
        {**row, "__ivm_g0": "a", names.COUNT: 1, sum_v: 5},
        {**row, "__ivm_g0": "b", names.COUNT: -1},
        {**row, "__ivm_g0": None, names.COUNT: 1, sum_v: None},
    ]
    result = {r["__ivm_g0"]: r for r in apply_changes(plan, [a, b], changes)}
    assert sorted(result, key=str) == [None, "a"]
    assert (result["a"][names.COUNT], result["a"][sum_v]) == (3, 5)
    assert result[None][sum_v] is None  # inserted as the change has it


def test_apply_changes_keeps_a_global_aggregates_group_row() -> None:
    plan = _plan("global")
    row = {c.name: 0 for c in plan.state_columns}
    (kept,) = apply_changes(plan, [{**row, names.COUNT: 1}], [{**row, names.COUNT: -1}])
    assert kept[names.COUNT] == 0


def test_apply_changes_takes_recomputed_values_only_when_touched() -> None:
    plan = _plan("extremes")
    (pre, *_) = plan.preaggregations
    (minimum, _kind) = pre.recomputed[0]
    columns = [
        *plan.merge_keys,
        *(c.name for c in plan.state_columns),
        *(p.touched_flag for p in plan.preaggregations),
    ]
    row = {c: None for c in columns} | {names.SLOT: 0, "__ivm_g0": "a", names.COUNT: 2}
    untouched = {**row, names.COUNT: 1, minimum: 9, pre.touched_flag: None}
    touched = {**row, names.COUNT: 1, minimum: 9, pre.touched_flag: True}
    stored = {**row, minimum: 1}
    assert apply_changes(plan, [stored], [untouched])[0][minimum] == 1
    assert apply_changes(plan, [stored], [touched])[0][minimum] == 9
