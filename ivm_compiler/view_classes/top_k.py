"""Top-k: `ORDER BY ... LIMIT k` on the whole model, a modifier of any view class.

It is no view class of its own (compile.VIEW_CLASSES): compile_model plans
the query without ORDER BY and LIMIT by its class, then `extract` adds the
ordering to the plan, and emit.view_query wraps the class's view in `ordered`.

Which rows are the top k can change with any change of any row (a deleted
leader lets the (k+1)-th in), so the state keeps the query's rows without the
LIMIT: every candidate, maintained by the rules of the query's own class. The
view applies `ORDER BY ... LIMIT k` when it is read; the ordering columns
must therefore be output columns (by name or ordinal). That costs a sort of
the state per read and no work per refresh beyond the query's own.

Ties: where the ORDER BY does not order the k-th row strictly, Spark returns
any of the tied rows, and so does the view; a fresh run of the query may pick
others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.sql import DIALECT

# Any query tree (sqlglot's Query trees are Expr, not Expression).
_Tree = TypeVar("_Tree", bound=exp.Expr)


def is_top_k(tree: exp.Expr) -> bool:
    """An ORDER BY and a LIMIT on the model's query itself."""
    return bool(tree.args.get("order") and tree.args.get("limit"))


def without_top_k(tree: _Tree) -> _Tree:
    """The query without its top-level ORDER BY and LIMIT: the rows a top-k state keeps."""
    if not is_top_k(tree):
        return tree
    stripped = tree.copy()
    stripped.set("order", None)
    stripped.set("limit", None)
    return stripped


@dataclass(frozen=True)
class Ordering:
    output: str  # the output column's name, as the view shows it
    descending: bool
    nulls_first: bool


@dataclass(frozen=True)
class TopK:
    order: tuple[Ordering, ...]
    limit: int

    def describe(self) -> str:
        """A stable text of the ordering and k, for the state's fingerprint."""
        return (
            ", ".join(
                f"{o.output} {'DESC' if o.descending else 'ASC'} NULLS "
                f"{'FIRST' if o.nulls_first else 'LAST'}"
                for o in self.order
            )
            + f" LIMIT {self.limit}"
        )


def extract(model: str, tree: exp.Query, outputs: list[str]) -> TopK | None:
    """The model's top-k over its `outputs` (names as Spark gives them), or None.

    Call with the parsed query as written; refuses what the view cannot order.
    """
    if not is_top_k(tree):
        return None
    if tree.args.get("offset"):
        raise NotMaintainable(model, "OFFSET", "remove it, or " + FALLBACK_HINT)
    limit = tree.args["limit"].expression
    if not (isinstance(limit, exp.Literal) and limit.is_int):
        raise NotMaintainable(
            model,
            f"LIMIT {limit.sql(dialect=DIALECT)} (not a whole number)",
            "write LIMIT with a number",
        )
    by_name = {name.lower(): name for name in outputs}
    order = []
    for item in tree.args["order"].expressions:
        assert isinstance(item, exp.Ordered)
        key = item.this
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.name) <= len(outputs):
            name = outputs[int(key.name) - 1]
        elif (
            isinstance(key, exp.Column)
            and key.name.lower() in by_name
            and (not key.table or _selected(tree, key))
        ):
            name = by_name[key.name.lower()]
        else:
            raise NotMaintainable(
                model,
                f"ORDER BY {key.sql(dialect=DIALECT)} with LIMIT, which is not an output column",
                "select the ordering expression as a column and order by its name or position",
            )
        descending = bool(item.args.get("desc"))
        # Spark's default: NULLs first ascending, last descending.
        nulls_first = item.args.get("nulls_first")
        order.append(
            Ordering(
                output=name,
                descending=descending,
                nulls_first=(not descending) if nulls_first is None else bool(nulls_first),
            )
        )
    return TopK(order=tuple(order), limit=int(limit.name))


def _selected(tree: exp.Query, column: exp.Column) -> bool:
    """A qualified column (`s.k`) that the SELECT list shows as it is."""
    selects = tree.selects if isinstance(tree, exp.Select) else []
    return any(
        (p.this if isinstance(p, exp.Alias) else p) == column and p.alias_or_name == column.name
        for p in selects
    )


def ordered(select: exp.Query, top: TopK) -> exp.Select:
    """`SELECT * FROM (select) ORDER BY ... LIMIT k`: the view over the full ranking state."""
    return (
        exp.select("*")
        .from_(select.subquery(exp.to_identifier(names.RANKED_ALIAS, quoted=True)))
        .order_by(
            *(
                exp.Ordered(
                    this=exp.column(o.output, quoted=True),
                    desc=o.descending,
                    nulls_first=o.nulls_first,
                )
                for o in top.order
            )
        )
        .limit(top.limit)
    )
