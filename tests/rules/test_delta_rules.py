"""Property: for every model, the compiler's delta rules keep the state equal to a rebuild.

For random small sources and random sequences of commits (inserts, updates,
deletes; NULLs and duplicate rows; one to four commits between two
refreshes, some of them touching no row), every refresh must satisfy
(oracle.py)

    state(v) (+) change(v..v') == state(v')   and   view(state(v')) == query(sources at v')

with the compiler's own statements run by DuckDB over a simulated Delta
change feed (engine.py). The second refresh of each scenario is a recompute
merged by key (emit.merge_recomputed), which must leave the build. No Spark, no JVM: the whole layer takes well under
a minute, and a failing example is shrunk by hypothesis to a few rows and
commits (the Mismatch lists the commits and the rows that differ).

CI replays a fixed set of examples (derandomize), so a red run reproduces.
IVM_RULES_EXAMPLES=<n> runs n examples per model (default 3);
IVM_RULES_RANDOM=1 draws new ones each run; IVM_RULES_SHRINK=0 skips shrinking.
"""

from __future__ import annotations

import contextlib
import os
import unittest.mock
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from ivm_compiler import TableName, reads
from ivm_compiler import changes as change_terms
from ivm_compiler.rules import top_k_buffer
from tests.rules.engine import Change, ChangeRow, Delete, Insert, Supersede, Update
from tests.rules.models import DIM, MODELS, SRC, TAG, Model, Source
from tests.rules.oracle import Mismatch, Refreshes, Scenario, run

EXAMPLES = int(os.environ.get("IVM_RULES_EXAMPLES", "3"))

# What a broken rule fails with: the state differs from the build, or a
# bounded MIN/MAX keeps other values than the group's best (oracle._check_kept).
CAUGHT = "differs from the build|not the best of its values"

RULES_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=os.environ.get("IVM_RULES_RANDOM", "") != "1",
    database=None,
    deadline=None,
    # A model's first example compiles it and translates its statements.
    suppress_health_check=[HealthCheck.too_slow],
    # IVM_RULES_SHRINK=0: report the first failing example as drawn, in seconds
    # rather than the minutes shrinking can take (for checking that a
    # deliberately broken rule fails).
    phases=[p for p in Phase if os.environ.get("IVM_RULES_SHRINK") != "0" or p != Phase.shrink],
)


def rows(source: Source) -> st.SearchStrategy[tuple[object, ...]]:
    return st.tuples(*(st.sampled_from(column.values) for column in source.columns))


def changes(source: Source) -> st.SearchStrategy[Change]:
    """One statement on the source: inserts twice as likely as updates or deletes."""
    inserts = st.lists(rows(source), min_size=1, max_size=4).map(lambda r: Insert(tuple(r)))
    where = st.sampled_from(source.columns).flatmap(
        lambda c: st.tuples(st.just(c.name), st.sampled_from(c.values))
    )
    settable = [c for c in source.columns if not c.serial]
    assignment = st.sampled_from(settable).flatmap(
        lambda c: st.tuples(st.just(c.name), st.sampled_from(c.values))
    )
    updates = st.tuples(where, assignment).map(lambda p: Update(*p[0], *p[1]))
    deletes = where.map(lambda w: Delete(*w))
    if source.scd2 is None:
        return st.one_of(inserts, inserts, updates, deletes)
    return st.one_of(inserts, inserts, updates, deletes, superseding(source, source.scd2))


def superseding(source: Source, scd2: tuple[str, str, str]) -> st.SearchStrategy[Change]:
    """A key's versions closed at a time and its next version opened then, in one commit."""
    key, valid_from, valid_to = scd2
    by_name = {c.name: c for c in source.columns}
    times = [t for t in by_name[valid_from].values if t is not None]

    def opened(pair: tuple[object, object], row: tuple[object, ...]) -> Supersede:
        k, t = pair
        named = dict(zip(by_name, row)) | {key: k, valid_from: t, valid_to: None}
        return Supersede(Update(key, k, valid_to, t), (tuple(named.values()),))

    keys = st.sampled_from(by_name[key].values)
    return st.builds(opened, st.tuples(keys, st.sampled_from(times)), rows(source))


def scenarios(model: Model) -> st.SearchStrategy[Scenario]:
    """Seed rows for each source, then up to 3 refreshes, each after 1 to 4 commits.

    Most of a refresh's cost is translating its statements, not their rows,
    so each refresh gets several commits. (Hypothesis' first, simplest
    example is the one with no seed rows: a build over empty sources.)
    """
    seeds = st.tuples(*(st.lists(rows(s), max_size=8) for s in model.sources)).map(
        lambda seeded: tuple((s.name, Insert(tuple(r))) for s, r in zip(model.sources, seeded) if r)
    )
    commits = st.sampled_from(model.sources).flatmap(
        lambda s: changes(s).map(lambda c: (s.name, c))
    )
    steps = st.lists(st.lists(commits, min_size=1, max_size=4).map(tuple), min_size=1, max_size=3)
    return st.builds(Scenario, seeds, steps.map(tuple))


# Models the compiler maintains wrongly today: xfail(strict=True), with the reason.
KNOWN_WRONG: dict[str, str] = {}


def _cases() -> list:
    return [
        pytest.param(
            model,
            id=model.name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[model.name])]
            if model.name in KNOWN_WRONG
            else [],
        )
        for model in MODELS
    ]


@pytest.mark.parametrize("model", _cases())
@RULES_SETTINGS
@given(data=st.data())
def test_refreshes_equal_rebuilds_and_the_query(model: Model, data: st.DataObject) -> None:
    # The second refresh recomputes, merged by key, and a third applies over it.
    run(model, data.draw(scenarios(model), label="scenario"), recompute_at=(1,))


# -- the layer can fail ------------------------------------------------------------------

MODEL_BY_NAME = {model.name: model for model in MODELS}
SEED = (
    (SRC.name, Insert(((1, "a", 1, Decimal("1.50")), (1, "a", 2, None), (None, None, None, None)))),
    (DIM.name, Insert(((1, "x", 1),))),
)
# One refresh after an insert, an update and a delete.
STEPS = (
    (
        (SRC.name, Insert(((1, "b", 0, Decimal("-2.25")),))),
        (SRC.name, Update("k", 1, "v", 0)),
        (SRC.name, Delete("g", None)),
    ),
)


def _scenario(model: Model) -> Scenario:
    """SEED and STEPS, without the commits to tables the model does not read."""
    read = {source.name for source in model.sources}
    return Scenario(
        tuple(c for c in SEED if c[0] in read),
        tuple(tuple(c for c in step if c[0] in read) for step in STEPS),
    )


def _flip_first_insert(table: object, feed: list[ChangeRow]) -> list[ChangeRow]:
    """A change feed whose first inserted row says it was deleted (its sign flips)."""
    flipped = list(feed)
    for index, change in enumerate(flipped):
        if change.change_type == "insert":
            flipped[index] = ChangeRow(change.row, "delete", change.version)
            break
    return flipped


@pytest.mark.parametrize("name", ["grouped", "keeps_key", "joined_groups", "set_except_all"])
def test_the_unchanged_feed_passes(name: str) -> None:
    """The scenario the tests below tamper with passes as it is."""
    run(MODEL_BY_NAME[name], _scenario(MODEL_BY_NAME[name]))


@pytest.mark.parametrize("name", ["grouped", "keeps_key", "joined_groups", "set_except_all"])
def test_a_change_row_with_its_sign_flipped_is_caught(name: str) -> None:
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME[name], _scenario(MODEL_BY_NAME[name]), hook=_flip_first_insert)


def test_a_wrong_delta_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that reads an update's postimage as a removal fails on the first update."""
    monkeypatch.setattr(reads, "ADDING_CHANGE_TYPES", ("insert",))
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME["grouped"], _scenario(MODEL_BY_NAME["grouped"]))


@RULES_SETTINGS
@given(scenario=scenarios(MODEL_BY_NAME["grouped"]))
def test_hypothesis_finds_a_flipped_sign(scenario: Scenario) -> None:
    """Over random scenarios, every one with an insert after the build fails with the flip."""
    inserted = any(isinstance(change, Insert) for step in scenario.steps for _, change in step)
    if not inserted:
        return
    with pytest.raises(Mismatch):
        run(MODEL_BY_NAME["grouped"], scenario, hook=_flip_first_insert)


def _dominated(name: str, aggregate: str, rows: tuple, *also: Change) -> Refreshes:
    """Build over `rows`, then delete the rows with v = 2 (the dominating value), with `also`."""
    model = Model(
        f"dominated_{name}", f"select g, {aggregate} as a from {SRC.name} group by g", (SRC,)
    )
    step = ((SRC.name, Delete("v", 2)), *((SRC.name, change) for change in also))
    return run(model, Scenario(((SRC.name, Insert(rows)),), (step,)))


# -- bounded MIN/MAX (rules/extremes.py; oracle.RULES_EXTREMES_KEPT = 1) ----------------

EXTREMES = Model(
    "bounded_extremes",
    f"select g, min(v) as mn, max(v) as mx, count(*) as n from {SRC.name} group by g",
    (SRC,),
)


def test_deleting_the_kept_extreme_refills_it_from_the_sources() -> None:
    """Group a keeps MIN {1} and MAX {4}; deleting 1 leaves it none: 2 comes from the sources."""
    rows = tuple((0, "a", v, None) for v in (1, 2, 3, 4))
    refreshes = run(
        EXTREMES,
        Scenario(((SRC.name, Insert(rows)),), (((SRC.name, Delete("v", 1)),),)),
    )
    assert len(refreshes.refilled) == 1
    assert refreshes.most_kept == [{1: 1, 2: 1}]


def test_values_past_the_kept_edge_are_left_out_and_a_new_group_is_cut_back() -> None:
    """A new group's four values are cut back to its best one; later ones past it are left out.

    Deleting a value past the edge then touches nothing kept, and nothing is refilled.
    """
    refreshes = run(
        EXTREMES,
        Scenario(
            ((SRC.name, Insert(((0, "a", 0, None),))),),
            (
                ((SRC.name, Insert(tuple((0, "b", v, None) for v in (1, 2, 3, 4)))),),
                ((SRC.name, Insert(((0, "b", 3, None),))),),
                ((SRC.name, Delete("v", 3)),),
            ),
        ),
    )
    assert refreshes.refilled == []
    assert refreshes.most_kept == [{1: 1, 2: 1}] * 3


# -- a top-k state kept to its best rows (rules/top_k_buffer.py) ---------------------------


@pytest.mark.parametrize("name", ["top_rows", "top_distinct"])
@RULES_SETTINGS
@given(data=st.data())
def test_a_top_k_state_kept_to_k_rows_stays_its_query(name: str, data: st.DataObject) -> None:
    """Kept to exactly k best rows, so changes past the edge and refills happen on a few rows."""
    model = MODEL_BY_NAME[name]
    scenario = data.draw(scenarios(model), label="scenario")
    with unittest.mock.patch.multiple(top_k_buffer, MIN_ROWS=0, ROWS_PER_K=1):
        # The second refresh a recompute merged by key, as in the property test.
        run(model, scenario, recompute_at=(1,))


def test_a_top_k_state_leaves_out_rows_past_its_edge_and_refills_when_short() -> None:
    """top_rows (v DESC, k, g; k = 3) kept to 3 rows over 5: a row past the edge is left
    out; deleting two of the three leaves one, and the best three come from the query."""
    rows = tuple((k, "a", v, None) for k, v in ((1, 2), (2, 1), (3, 0), (4, -1), (5, -2)))

    def kept() -> list[int]:
        return sorted(row["__ivm_g0"] for row in refreshes._state())

    with (
        unittest.mock.patch.multiple(top_k_buffer, MIN_ROWS=0, ROWS_PER_K=1),
        contextlib.closing(Refreshes(MODEL_BY_NAME["top_rows"])) as refreshes,
    ):
        refreshes.commit(SRC.name, Insert(rows))
        refreshes.build()
        assert kept() == [1, 2, 3]
        # Past the edge (v 0): left out.
        refreshes.commit(SRC.name, Insert(((6, "a", -2, None),)))
        refreshes.refresh()
        assert kept() == [1, 2, 3] and refreshes.refilled_top_k == []
        # One row left of three: the query's best three of what is left, k 3, 4 and 5
        # (6 ties with 5 on v and comes after it on k).
        refreshes.commit(SRC.name, Delete("v", 2))
        refreshes.commit(SRC.name, Delete("v", 1))
        refreshes.refresh()
        assert refreshes.refilled_top_k == [refreshes.history[-1]]
        assert kept() == [3, 4, 5]


# -- change feeds staged once (writes.StateWrites.staged_feeds) ------------------------

# One refresh after both inputs of a join changed: each feed is read by the
# key-bounds probe and by two terms of the join's change.
BOTH_INPUTS = (
    (
        (SRC.name, Insert(((1, "b", 0, Decimal("-2.25")), (2, "c", 1, None)))),
        (DIM.name, Insert(((2, "y", 2),))),
        (DIM.name, Update("k", 1, "w", 2)),
    ),
)


@pytest.mark.parametrize(("name", "log"), [("joined_groups", False), ("joined_rows", True)])
def test_a_join_reads_each_changed_inputs_feed_from_its_stage(name: str, log: bool) -> None:
    refreshes = run(MODEL_BY_NAME[name], Scenario(SEED, BOTH_INPUTS), log=log)
    assert refreshes.staged_feeds == 2


def _empty_stages(monkeypatch: pytest.MonkeyPatch, builder: str) -> None:
    """reads.<builder>'s CACHE TABLE statements made to hold no rows (WHERE FALSE)."""
    stage = getattr(reads, builder)

    def empty(*args: object, **kwargs: object) -> exp.Cache:
        staged = stage(*args, **kwargs)
        staged.expression.set("where", exp.Where(this=exp.false()))
        return staged

    monkeypatch.setattr(reads, builder, empty)


@pytest.mark.parametrize(("name", "log"), [("joined_groups", False), ("joined_rows", True)])
def test_a_stage_missing_its_rows_is_caught(
    name: str, log: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statements read the stage, not the feed: an empty stage loses the change."""
    _empty_stages(monkeypatch, "stage_feed")
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME[name], Scenario(SEED, BOTH_INPUTS), log=log)


# A plan node (an upstream ivm model) joined to a changed dimension: its change
# is read by the key-bounds probe, its own term and the dimension's term.
@pytest.mark.parametrize("log", [False, True])
def test_an_upstreams_change_read_twice_is_read_from_its_stage(
    log: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged: list[TableName] = []
    stage = reads.stage_upstream_change

    def counted(table: TableName, *args: object, **kwargs: object) -> exp.Cache:
        staged.append(table)
        return stage(table, *args, **kwargs)

    monkeypatch.setattr(reads, "stage_upstream_change", counted)
    run(MODEL_BY_NAME["cte_totals"], Scenario(SEED, BOTH_INPUTS), log=log)
    assert staged


def test_an_upstream_stage_missing_its_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The statements read the upstream's stage, not its state's feed."""
    _empty_stages(monkeypatch, "stage_upstream_change")
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME["cte_totals"], Scenario(SEED, BOTH_INPUTS))


# -- small sources' snapshots staged once (writes.StateWrites.staged_snapshots) ---------

# The seed with tags for both dimension names, so the three-way join has rows.
TAGGED = (*SEED, (TAG.name, Insert((("x", "X"), ("y", "N"), ("w", None)))))


@pytest.mark.parametrize("log", [False, True])
def test_a_snapshot_read_by_two_terms_is_read_from_its_stage(log: bool) -> None:
    # Both changed inputs' terms read the third input at its pinned version.
    refreshes = run(MODEL_BY_NAME["three_way_grouped"], Scenario(TAGGED, BOTH_INPUTS), log=log)
    assert refreshes.staged_snapshots >= 1


def test_a_snapshot_stage_missing_its_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write reads the stage, not the table: an empty stage loses the partner's rows."""
    _empty_stages(monkeypatch, "stage_snapshot")
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME["three_way_grouped"], Scenario(TAGGED, BOTH_INPUTS))


# Deleting 1e9 from {-0.2, 0.1, 1e9 + 0.5}: taking it out of the moments by
# Chan's rule subtracts two numbers as large as the M2 with it, which kept the
# M2 of {-0.2, 0.1} (0.045) as 128 (STDDEV 11.3 for 0.21). The MERGE now
# refuses a removal that cancels that much (rules/moments.cancels), and the
# refresh recomputes that group from the sources while it merges the change
# into the others; run() checks state and view against a rebuild.
def test_deleting_a_value_that_dominates_its_moments_recomputes_its_group() -> None:
    refreshes = _dominated(
        "moments",
        "stddev(case when v = 2 then 1e9 + 0.5 else cast(v as double) / 10 end)",
        ((0, "a", -2, None), (0, "a", 1, None), (0, "a", 2, None), (0, "b", 5, None)),
        Insert(((0, "b", 7, None),)),
    )
    assert len(refreshes.recomputed) == 1
    assert refreshes.replaced_groups == [("a",)]


def test_a_global_aggregate_recomputes_its_one_group() -> None:
    model = Model(
        "dominated_global",
        "select stddev(case when v = 2 then 1e9 + 0.5 else cast(v as double) / 10 end) as a "
        f"from {SRC.name}",
        (SRC,),
    )
    rows = ((0, "a", -2, None), (0, "a", 1, None), (0, "b", 2, None))
    refreshes = run(model, Scenario(((SRC.name, Insert(rows)),), (((SRC.name, Delete("v", 2)),),)))
    assert refreshes.replaced_groups == [()]


def test_a_cancelling_removal_beside_a_pre_aggregation_recomputes_the_model() -> None:
    refreshes = _dominated(
        "moments_and_max",
        "stddev(case when v = 2 then 1e9 + 0.5 else cast(v as double) / 10 end) + max(v)",
        ((0, "a", -2, None), (0, "a", 1, None), (0, "a", 2, None)),
    )
    assert len(refreshes.recomputed) == 1 and refreshes.replaced_groups == []


def test_deleting_a_value_that_does_not_dominate_is_merged() -> None:
    refreshes = _dominated(
        "moments_spread",
        "stddev(cast(v as double) / 10)",
        ((0, "a", -2, None), (0, "a", 1, None), (0, "a", 2, None), (0, "a", 5, None)),
    )
    assert refreshes.recomputed == []


# Deleting 1e17 from a DOUBLE SUM built over 1e17 and 1.0: the build's SUM
# kept 1e17 (1.0 is below its rounding), so the stored sum alone left 0.0
# where the query says 1.0. The sum's inexact mass (rules/floating.py) makes
# the MERGE refuse it, and the group is recomputed.
def test_deleting_a_value_that_dominates_a_double_sum_recomputes_its_group() -> None:
    refreshes = _dominated(
        "sum",
        "sum(case when v = 2 then 1e17 else cast(v as double) end)",
        ((0, "a", 1, None), (0, "a", 2, None), (0, "b", 5, None), (0, "b", 6, None)),
        Insert(((0, "b", 7, None),)),
    )
    assert refreshes.replaced_groups == [("a",)]


def test_an_average_in_one_change_that_cancels_recomputes_its_group() -> None:
    """The 1e17 inserted and deleted by the same refresh: its SUM over the change rounds too."""
    model = Model(
        "cancelled_in_one_change",
        f"select g, avg(case when v = 2 then 1e17 else cast(v as double) end) as a "
        f"from {SRC.name} group by g",
        (SRC,),
    )
    step = ((SRC.name, Insert(((0, "a", 1, None), (0, "a", 2, None)))), (SRC.name, Delete("v", 2)))
    refreshes = run(model, Scenario(((SRC.name, Insert(((0, "b", 3, None),))),), (step,)))
    assert refreshes.replaced_groups == [("a",)]


def test_an_exact_double_sum_returning_to_zero_is_merged() -> None:
    """Integral doubles sum exactly, so a refund that brings a group back to 0 merges."""
    refreshes = _dominated(
        "exact_sum",
        "sum(case when v = 2 then -3.0 else cast(v as double) end)",
        ((0, "a", 1, None), (0, "a", 2, None), (0, "a", 3, None)),
        Insert(((0, "a", -4, None),)),
    )
    assert refreshes.recomputed == [] and refreshes.replaced_groups == []


def test_a_ledger_of_fractions_back_to_zero_is_merged() -> None:
    """Entries that cancel leave the sum at 0, not their absolute total: no recomputation.

    A recomputation of such a group rounds as much as the refresh; recomputing
    it would only repeat on every change that touches it.
    """
    refreshes = _dominated(
        "ledger",
        "sum(cast(v as double) / 4)",
        ((0, "a", 1, None), (0, "a", -1, None), (0, "a", 2, None), (0, "a", -2, None)),
        Insert(((0, "a", 2, None),)),
    )
    assert refreshes.recomputed == [] and refreshes.replaced_groups == []


def test_a_double_sum_beside_a_pre_aggregation_recomputes_the_model() -> None:
    refreshes = _dominated(
        "sum_and_max",
        "sum(case when v = 2 then 1e17 else cast(v as double) end) + max(v)",
        ((0, "a", 1, None), (0, "a", 2, None)),
    )
    assert len(refreshes.recomputed) == 1 and refreshes.replaced_groups == []


# -- plan nodes: a subquery over a join (subquery_inputs.py) --------------------------

NODE_SEED = (
    (SRC.name, Insert(((1, "a", 1, None), (2, "b", 2, None), (None, "c", 0, None)))),
    (DIM.name, Insert(((1, "x", 1),))),
    (TAG.name, Insert((("x", "X"),))),
)
# Key 2 gains its first partner in the join, key 1 loses its last.
NODE_STEPS = (((DIM.name, Insert(((2, "x", 0),))), (DIM.name, Delete("k", 1))),)


def _flip_in_nodes(table: TableName, feed: list[ChangeRow]) -> list[ChangeRow]:
    """The inserted rows of a plan node's state feed, read as deleted (its guard row's too)."""
    if "__ivm_cte_" not in table.name:
        return feed
    return [ChangeRow(c.row, "delete", c.version) if c.change_type == "insert" else c for c in feed]


def test_a_subquery_over_a_join_is_a_node_whose_change_drives_the_anti_join() -> None:
    refreshes = run(MODEL_BY_NAME["not_exists_join"], Scenario(NODE_SEED, NODE_STEPS))
    (node,) = refreshes.nodes
    assert node.state == TableName("analytics", "model__ivm_cte_subquery__ivm_state")
    assert node.tables[node.state].version == 2  # built, then refreshed once


def test_a_flipped_sign_in_a_nodes_change_feed_is_caught() -> None:
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME["not_exists_join"], Scenario(NODE_SEED, NODE_STEPS), hook=_flip_in_nodes)


# -- key relations the change leaves as they were (changes.with_unchanged_relations) --

# NOT IN with NULLs on both sides: `dim` changes by rows that are not NULL,
# so "the subquery has a NULL" has no change; "it has rows" keeps rows.
NOT_IN_STEPS = (
    ((DIM.name, Insert(((2, "x", 5), (3, "x", 6)))),),
    ((DIM.name, Update("k", 2, "w", 7)), (SRC.name, Insert(((5, "c", 1, None),)))),
    ((DIM.name, Insert(((4, "x", None),))),),
    ((DIM.name, Delete("w", None)),),
)


def test_a_key_relation_the_change_leaves_is_read_at_its_pinned_version_alone() -> None:
    refreshes = run(MODEL_BY_NAME["not_in_nulls"], Scenario(SEED, NOT_IN_STEPS))
    # Every refresh but the two that insert and delete a NULL `w` leaves
    # "has a NULL" as it was; "has rows" has more rows than any change has.
    null, rows = "__ivm_semi0_null", "__ivm_semi0_rows"
    assert refreshes.unchanged_relations.count(null) == 2, refreshes.unchanged_relations
    assert refreshes.unchanged_relations.count(rows) >= 2, refreshes.unchanged_relations


def test_a_changed_key_relation_taken_as_unchanged_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Marking every relation unchanged loses the NULL's arrival: the oracle sees it."""
    monkeypatch.setattr(
        change_terms, "unchanged_relations", lambda touched, present=None: set(touched)
    )
    with pytest.raises(Mismatch, match=CAUGHT):
        run(MODEL_BY_NAME["not_in_nulls"], Scenario(SEED, NOT_IN_STEPS))
