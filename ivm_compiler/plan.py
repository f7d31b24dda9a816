"""The maintenance plan: what a compiled ivm model stores and how each piece changes.

Frozen dataclasses only. The plan holds sqlglot expressions over the model's
source (qualified by the source's alias in the model) and over the state
table's columns; emit.py turns it into Spark SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sqlglot import exp

from ivm_compiler.parse import TableName


class ViewClass(str, Enum):
    """The view classes of the KV-store and consistency-levels papers that the compiler maintains."""

    # SELECT exprs FROM src WHERE p: a bag, kept as distinct rows with a multiplicity.
    PROJECTION = "projection"
    # SELECT DISTINCT exprs FROM src WHERE p: the same state, each row shown once.
    DISTINCT = "distinct"
    # SELECT keys, aggs FROM src WHERE p GROUP BY keys [HAVING q]: one state row per group.
    GROUPED_AGGREGATE = "grouped_aggregate"
    # SELECT aggs FROM src WHERE p [HAVING q]: exactly one state row, even for an empty source.
    GLOBAL_AGGREGATE = "global_aggregate"


class MergeRule(str, Enum):
    """How a state column combines its stored value with a delta row's value."""

    KEY = "key"  # identifies the row; matched null-safely, never updated
    ADD = "add"  # counts: stored + delta
    ADD_NULLABLE = "add_nullable"  # sums: NULL stands for "no non-NULL input yet"


@dataclass(frozen=True)
class StateColumn:
    name: str
    rule: MergeRule
    # The column computed from source rows at one version (first build, full refresh).
    build: exp.Expression
    # The column computed from signed change rows (each carries names.SIGN = +1/-1).
    delta: exp.Expression


@dataclass(frozen=True)
class OutputColumn:
    """A column of the model as users see it: Spark's own name and type for the model's query."""

    name: str
    data_type: str
    # Computed from the state table's columns.
    expression: exp.Expression


@dataclass(frozen=True)
class ViewPlan:
    model: str
    view_class: ViewClass
    # The model's SQL exactly as dbt compiled it, and its parse (not rewritten).
    sql: str
    query: exp.Select
    source: TableName
    # The name the model's query uses for its source (its alias, or the table name).
    source_alias: str
    where: exp.Expression | None
    # Source expressions that identify a state row (GROUP BY keys, or every
    # projected expression of a projection); parallel to the KEY state columns.
    keys: tuple[exp.Expression, ...]
    state_columns: tuple[StateColumn, ...]
    outputs: tuple[OutputColumn, ...]
    # HAVING, rewritten over state columns; groups that fail it stay in the state.
    having: exp.Expression | None
    # Changes whenever the maintained state would mean something else: a model
    # whose fingerprint differs from its state's is rebuilt, never patched.
    fingerprint: str

    @property
    def key_columns(self) -> tuple[StateColumn, ...]:
        return tuple(c for c in self.state_columns if c.rule is MergeRule.KEY)

    @property
    def value_columns(self) -> tuple[StateColumn, ...]:
        return tuple(c for c in self.state_columns if c.rule is not MergeRule.KEY)
