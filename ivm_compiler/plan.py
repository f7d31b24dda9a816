"""The maintenance plan: what a compiled ivm model stores and how each piece changes.

Frozen dataclasses only. The plan holds the model's rows as one flattened
SELECT over its sources (FROM, JOINs and WHERE, qualified by the aliases the
model uses), and expressions over those flattened rows and over the state
table's columns; reads.py, changes.py, state_rows.py and emit.py turn it into Spark SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.sql import TableName
from ivm_compiler.view_classes.top_k import TopK


class ViewClass(str, Enum):
    """The view classes of the KV-store and consistency-levels papers that the compiler maintains."""

    # Every class reads FROM one source or a join of several.
    # SELECT exprs FROM src WHERE p: a bag, kept as distinct rows with a multiplicity.
    PROJECTION = "projection"
    # SELECT DISTINCT exprs FROM src WHERE p: the same state, each row shown once.
    DISTINCT = "distinct"
    # SELECT keys, aggs FROM src WHERE p GROUP BY keys [HAVING q]: one state row per group.
    GROUPED_AGGREGATE = "grouped_aggregate"
    # SELECT aggs FROM src WHERE p [HAVING q]: exactly one state row, even for an empty source.
    GLOBAL_AGGREGATE = "global_aggregate"
    # a INTERSECT|EXCEPT [ALL] b ...: one state row per distinct output row with a
    # count per operand (UNION ALL is a PROJECTION, UNION a DISTINCT over all operands).
    SET_OPERATION = "set_operation"
    # SELECT exprs, f(...) OVER (PARTITION BY p ...) FROM src WHERE q: the projection's
    # state (rows with a multiplicity); a change recomputes the partitions it touches
    # (view_classes/window.py).
    WINDOW = "window"


class MergeRule(str, Enum):
    """How a state column combines its stored value with a change row's value."""

    KEY = "key"  # identifies the row; matched null-safely, never updated
    ADD = "add"  # counts: stored + change
    ADD_NULLABLE = "add_nullable"  # sums: NULL stands for "no non-NULL input yet"
    # MIN, MAX, COUNT(DISTINCT): not additive. The change row carries the value
    # recomputed from the group's pre-aggregation rows whenever the refresh
    # touched them (its touched flag is set); otherwise the stored value stays.
    RECOMPUTED = "recomputed"
    # A floating-point sum (rules/floating.py): stored + change, the addition's
    # rounding error added to its SUM_ERROR column, so deletes cancel exactly
    # what inserts added instead of leaving their rounding behind.
    COMPENSATED_SUM = "compensated_sum"
    SUM_ERROR = "sum_error"
    # What went through a floating-point sum's SUMs that may have rounded:
    # stored + change, as ADD, but it never decreases, so it tells the sum's
    # history, not its rows, and a rebuild's differs (rules/floating.py).
    MASS = "mass"
    # A mean or sum of squared deviations (rules/moments.py): the change's
    # inserted and removed values combined into the stored moments.
    MOMENT = "moment"
    # The co-moment of two arguments (rules/covariance.py), merged likewise.
    CO_MOMENT = "co_moment"
    # On change rows only, never stored: the removed values' moments.
    CHANGE_ONLY = "change_only"


@dataclass(frozen=True)
class SourceRef:
    """One occurrence of a source table in the model's FROM clause (a self-join has two)."""

    alias: str
    table: TableName


@dataclass(frozen=True)
class UpstreamModel:
    """A source that is itself an ivm model (a view over its state table).

    It is pinned and read through its state table, whose commits carry change
    data: the view is a row-by-row function of the state (filter, then one copy
    per multiplicity), so the view's change is that function applied to the
    state's signed change rows.
    """

    state: TableName
    # The view's definition: a SELECT over `state` (as Spark stores it).
    view: exp.Select
    # The state version the view shows (it reads the state VERSION AS OF it);
    # None for a view that reads the state's newest version.
    published_version: int | None = None
    # A state version of a log whose rows one commit wrote whole (a build or a
    # rewrite: every count positive, no retraction appended), which a read at
    # that version takes without summing per key (reads.table_at_version).
    unsummed_version: int | None = None


@dataclass(frozen=True)
class KeyRelation:
    """The distinct join keys of an outer join's null-supplying input.

    Read as SELECT DISTINCT <keys> FROM <input> WHERE <condition> AND <keys are
    not NULL>: the key values that have at least one partner. A row of the
    other side is NULL-padded exactly when its key is not among them, which
    turns the padded rows into a difference of inner joins
    (rules/outer_joins.py).
    """

    # The name the join term reads it under.
    alias: str
    # The input the keys are taken from (its table and the alias its columns use).
    source: SourceRef
    # One expression per key column, over source.alias; named names.join_key(i).
    keys: tuple[exp.Expr, ...]
    # The ON conjuncts over that input alone (rows failing them have no partner).
    condition: exp.Expr | None
    # Set for one refresh (changes.with_unchanged_relations): no change row
    # of its input has a key here, so it is the same at both versions and is
    # read at the pinned one, with no term of its own.
    unchanged: bool = False


@dataclass(frozen=True)
class PartnerFilter:
    """A semi or anti join of a term's rows with one input, on a whole condition.

    A row of the term is kept while it has a partner in the input (`anti`:
    while it has none) under `condition`, which may compare the two sides any
    way (`fact.ts BETWEEN dim.valid_from AND dim.valid_to`). Whether a row has
    a partner then depends on the row, not only on an equality key, so no key
    relation can stand for it; the filter is read as Spark's LEFT SEMI or
    LEFT ANTI JOIN of the input at a version, and its change is the rows whose
    answer the input's change turns (changes.signed_rows, rules/outer_joins.py).
    """

    # The input's table, and the alias `condition` names its columns by.
    source: SourceRef
    # The whole condition: equalities, comparisons of the two sides, and
    # conditions on either side alone.
    condition: exp.Expr
    anti: bool

    @property
    def alias(self) -> str:
        return self.source.alias


@dataclass(frozen=True)
class JoinTerm:
    """One signed inner-join term of a model whose FROM has outer joins.

    The model's rows equal the sum of sign * rows over its terms (as bags with
    multiplicities), and each term only joins inputs and key relations, then
    keeps the rows its partner filters pass, so its change follows the
    telescoping join rule with the filters as its last inputs;
    changes.signed_rows sums them.
    """

    sign: int
    # The flattened rows' SELECT with inner joins only; NULL-padded inputs are
    # gone, their columns replaced by typed NULLs.
    rows: exp.Select
    key_relations: tuple[KeyRelation, ...]
    # Semi and anti joins on conditions that compare the sides other than by
    # equality, applied to the rows in order.
    filters: tuple[PartnerFilter, ...] = ()


@dataclass(frozen=True)
class PreAggregation:
    """(group, value, count) rows for one aggregate argument, kept in the state table.

    They let MIN, MAX and COUNT(DISTINCT) of a group be recomputed from the
    group's distinct values when a change removes the current extreme, without
    reading the sources (the KV-store paper's PRE-AGGREGATION view).
    """

    argument_index: int
    slot: int
    # The flattened row column holding the argument, and the state column holding one value.
    argument: str
    value_column: str
    # The RECOMPUTED state columns this pre-aggregation feeds: (state column, MIN | MAX | COUNT).
    recomputed: tuple[tuple[str, str], ...]
    touched_flag: str
    # None: every distinct value of the group, one state row each (under
    # names.SLOT = `slot`). A number k: one MIN or MAX (its one `recomputed`
    # entry) kept from the group's most extreme values alone, at least k of
    # them unless the group has fewer, at most 2k, as an array on the group's
    # row (`values_column`; rules/extremes.py, "Bounded pre-aggregations").
    kept: int | None = None

    @property
    def bounded_kind(self) -> str | None:
        """MIN or MAX for a bounded pre-aggregation; None for one that keeps every value."""
        return self.recomputed[0][1] if self.kept is not None else None

    @property
    def values_column(self) -> str:
        """A bounded pre-aggregation's column of kept (value, count) pairs on the group row."""
        assert self.bounded_kind is not None
        return names.kept_values_of(self.argument_index, self.bounded_kind)


@dataclass(frozen=True)
class StateColumn:
    name: str
    rule: MergeRule
    # The column computed from source rows at one version (first build, full
    # refresh); None for CHANGE_ONLY columns, which are never stored, and for
    # a bounded MIN/MAX's kept values, which its rule's build query computes.
    build: exp.Expr | None
    # The column computed from signed change rows (each carries names.SIGN = +1/-1).
    change: exp.Expr
    # RECOMPUTED columns only: the pre-aggregation that recomputes it.
    preaggregation: int | None = None
    # COMPENSATED_SUM, SUM_ERROR and MOMENT columns: the aggregate argument
    # whose other columns their merge reads.
    argument: int | None = None
    # CO_MOMENT columns: the second argument (`argument` is the first).
    partner: int | None = None


@dataclass(frozen=True)
class PartitionColumn:
    """A PARTITION BY column of a WINDOW model: how the source and the state name it."""

    # The column over the model's source alias (the rows' WHERE can filter on it).
    source: exp.Column
    # The KEY state column holding its value on every state row.
    state_column: str
    # Its Spark type, to write the touched values back as literals.
    data_type: str


@dataclass(frozen=True)
class OutputColumn:
    """A column of the model as users see it: Spark's own name and type for the model's query."""

    name: str
    data_type: str
    # Computed from the state table's columns.
    expression: exp.Expr


@dataclass(frozen=True)
class ViewPlan:
    model: str
    view_class: ViewClass
    # The model's SQL exactly as dbt compiled it, and its parse (not rewritten).
    sql: str
    query: exp.Query
    # Every table occurrence in FROM, in query order.
    sources: tuple[SourceRef, ...]
    # SELECT <flattened columns> FROM <the model's sources and joins> WHERE <its filter>,
    # qualified (for a set operation: one such SELECT per operand, under UNION ALL);
    # its tables are replaced by versions or change feeds when it is emitted.
    rows: exp.Query
    # The flattened columns that identify a state row (GROUP BY keys, or every
    # projected expression of a projection); the KEY state columns have the same names.
    keys: tuple[str, ...]
    state_columns: tuple[StateColumn, ...]
    preaggregations: tuple[PreAggregation, ...]
    # Sources that are ivm models themselves, by the name the model reads.
    upstreams: Mapping[TableName, UpstreamModel]
    outputs: tuple[OutputColumn, ...]
    # HAVING, rewritten over state columns; groups that fail it stay in the state.
    having: exp.Expr | None
    # Changes whenever the maintained state would mean something else: a model
    # whose fingerprint differs from its state's is rebuilt, never patched.
    fingerprint: str
    # For SET_OPERATION: INTERSECT, INTERSECT ALL, EXCEPT or EXCEPT ALL.
    set_operation: str | None = None
    # With outer joins in FROM: the rows as signed inner-join terms, for the
    # change (the build reads `rows` itself). Empty: the rows are linear in
    # every input and change by the join rule directly.
    join_terms: tuple[JoinTerm, ...] = ()
    # For WINDOW: the PARTITION BY columns common to all its window functions
    # (empty: every refresh recomputes the whole model).
    window_partition: tuple[PartitionColumn, ...] = ()
    # Window functions whose result may depend on how ties are broken: the
    # refresh logs each every time it runs, unless the model sets
    # ivm_window_order_unique (the user vouches for a unique order).
    tie_warnings: tuple[str, ...] = ()
    # ORDER BY ... LIMIT k of the model: the view shows the top k of the state's
    # rows, which are every row or the best ones (view_classes/top_k.py).
    top_k: TopK | None = None
    # Source -> {column: type} of the source columns the model reads
    # (lineage.py): a refresh records them, and a later refresh that finds one
    # of them renamed, dropped or retyped rebuilds or stops instead of patching.
    source_columns: Mapping[TableName, Mapping[str, str]] = field(default_factory=dict)
    # ivm_state_form='log': the state is a log of change rows, consolidated
    # when read (log_state.py).
    log_state: bool = False

    @property
    def tables(self) -> tuple[TableName, ...]:
        """The distinct source tables, in query order: each is pinned once per refresh."""
        return tuple(dict.fromkeys(ref.table for ref in self.sources))

    @property
    def row_preaggregations(self) -> tuple[PreAggregation, ...]:
        """The pre-aggregations kept as state rows of their own (the unbounded ones)."""
        return tuple(p for p in self.preaggregations if p.kept is None)

    @property
    def merge_keys(self) -> tuple[str, ...]:
        """The state columns MERGE matches on: the row key, then the pre-aggregation's slot and value."""
        rows = self.row_preaggregations
        extra = (names.SLOT,) if rows else ()
        return (*self.keys, *extra, *(p.value_column for p in rows))

    @property
    def key_columns(self) -> tuple[StateColumn, ...]:
        return tuple(c for c in self.state_columns if c.rule is MergeRule.KEY)

    @property
    def value_columns(self) -> tuple[StateColumn, ...]:
        """The stored columns a change updates."""
        return tuple(
            c for c in self.state_columns if c.rule not in (MergeRule.KEY, MergeRule.CHANGE_ONLY)
        )
