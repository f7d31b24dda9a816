"""The protocol every view class module implements, and the qualified model its plan starts from.

A view class module answers, for the plans of its classes (CLASSES):
- takes: is a qualified query of this class? compile.VIEW_CLASSES asks each
  module in order and the first that takes the query plans it;
- plan: the ViewPlan (state columns, flattened rows, outputs), or
  NotMaintainable;
- build_query: the whole state at pinned versions (create_state, and a
  WINDOW model's recomputed partitions);
- change_query: per state row, the change one refresh applies (the MERGE's
  source in emit.merge_changes);
- leaves_state: when a matched state row is deleted by that MERGE;
- view: the model's rows from the state's rows.

Modules implement it with plain functions (mypy checks a module against a
Protocol), as sqlglot's optimizer rules are plain functions.

Why these six and not just plan, change and view: `takes` is what lets a
table pick the class instead of an if-chain in compile.py; `build_query`
differs where pre-aggregation rows are stored beside the group rows
(aggregates with MIN/MAX/COUNT(DISTINCT)); and `leaves_state` is where the
global aggregate says its one group row never leaves, which emit.py used
to test the class for.

Refusals that come before a class is chosen are not part of the protocol:
parse.py runs them on the query as written, before qualification (the class
is only known on the qualified query, which needs the catalog), and their
order decides which refusal a model with several problems gets. Those of
one class live in its module (set_operation.check_shape, window.check_shape)
and parse.py calls them at that point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sqlglot import exp

from ivm_compiler import key_bounds
from ivm_compiler.changes import JoinReads
from ivm_compiler.plan import UpstreamModel, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.sql import TableName


@dataclass(frozen=True)
class QualifiedModel:
    """A model as compile.py hands it to a view class's plan()."""

    model: str
    # The model's SQL and its parse without a top-k's ORDER BY and LIMIT.
    sql: str
    query: exp.Query
    # The sources it reads, in query order, and their (column, type) lists.
    tables: list[TableName]
    schemas: Mapping[TableName, list[tuple[str, str]]]
    # Qualified, with CTEs and FROM-subqueries merged and semi joins written as EXISTS.
    qualified: exp.Query
    # (name, Spark type) of each output column, as Spark describes the model's query.
    described: list[tuple[str, str]]
    upstreams: Mapping[TableName, UpstreamModel]
    # The catalog's DESCRIBE QUERY, for the type probes of aggregates.
    describe_query: Callable[[str], list[tuple[str, str]]]
    # compile.py's state fingerprint of a view class (compile.py owns
    # STATE_FORMAT_VERSION, which every fingerprint includes).
    fingerprint: Callable[[ViewClass], str]
    # How many extreme values a MIN or MAX keeps per group (None: all;
    # rules/extremes.py, the model's ivm_extreme_values).
    extremes_kept: int | None = None

    @property
    def upstreams_read(self) -> dict[TableName, UpstreamModel]:
        """The upstream ivm models among the tables the query reads."""
        return {t: u for t, u in self.upstreams.items() if t in self.tables}


class ViewClassRule(Protocol):
    """One view class module (see the module docstring for what each member is for)."""

    # The view classes whose plans these rules maintain. A module can plan a
    # query into another module's class: a UNION ALL chain is planned by
    # set_operation.py and maintained as a PROJECTION.
    CLASSES: tuple[ViewClass, ...]

    def takes(self, query: exp.Query) -> bool: ...

    def plan(self, model: QualifiedModel) -> ViewPlan: ...

    def build_query(
        self,
        plan: ViewPlan,
        versions: Mapping[TableName, int],
        rows_filter: exp.Expr | None = None,
    ) -> exp.Query: ...

    def change_query(
        self,
        plan: ViewPlan,
        ranges: Mapping[TableName, VersionRange],
        state: TableName,
        bounds: key_bounds.Bounds | None = None,
        join_reads: JoinReads | None = None,
    ) -> exp.Query: ...

    def leaves_state(self, plan: ViewPlan, emptied: exp.Expr) -> exp.Expr | None: ...

    def view(self, plan: ViewPlan, rows: exp.Select) -> exp.Select: ...
