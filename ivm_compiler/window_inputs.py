"""Window functions over any input: the rows a window reads, made a relation of their own.

view_classes/window.py maintains window functions over one relation: a change
touches some partitions, and those partitions are recomputed from that
relation's rows at the pinned version. A SELECT whose window functions read
anything else is rewritten here into window functions over a CTE holding
their input, and nodes.py makes that CTE a plan node, maintained by the delta
rules of its own class:

- a join, or rows filtered by EXISTS/IN: the node is the projection of the
  columns the SELECT list reads (`window_input`);
- groups (GROUP BY, HAVING, or aggregates beside the windows): the node is the
  aggregate, one column per GROUP BY expression and per aggregate, HAVING
  inside it (SQL filters groups before it evaluates windows);
- SELECT DISTINCT: SQL removes duplicates after it evaluates windows, so the
  node holds the windows (`window_rows`) and the model is DISTINCT over it.

For example (the SCD2 dimension built from a join)::

    SELECT a.id, b.name, LEAD(a.ts) OVER (PARTITION BY a.id ORDER BY a.ts) AS end_ts
    FROM a JOIN b ON a.b_id = b.id

becomes::

    WITH window_input AS (SELECT a.id AS id, b.name AS name, a.ts AS ts FROM a JOIN b ...)
    SELECT window_input.id, window_input.name,
           LEAD(window_input.ts) OVER (PARTITION BY window_input.id ...) AS end_ts
    FROM window_input

A refresh then applies the join's change to the node's state (the join's
delta rules), and recomputes only the window partitions the node's change
touches, reading the node's state filtered by those keys (Delta skips the
node's files of other partitions), not the join inputs.

Named windows (`OVER w ... WINDOW w AS (...)`) are inlined when the model is
parsed (inline_named_windows), so every later stage sees plain windows.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from ivm_compiler.errors import NotMaintainable
from ivm_compiler.rules.semi_joins import subquery_predicates
from ivm_compiler.sql import DIALECT, from_tables
from ivm_compiler.view_classes.window import windows_of

INPUT_CTE = "window_input"  # a join's (or filtered) rows under windows
ROWS_CTE = "window_rows"  # the windows' rows under SELECT DISTINCT


# -- named windows -------------------------------------------------------------


def inline_named_windows(model: str, tree: exp.Expr) -> exp.Expr:
    """Every `OVER name` replaced by the named window's definition; WINDOW clauses dropped.

    >>> import sqlglot
    >>> q = sqlglot.parse_one(
    ...     "select rank() over w as r from t window w as (partition by a order by b)",
    ...     read="spark")
    >>> inline_named_windows("m", q).sql(dialect="spark")
    'SELECT RANK() OVER (PARTITION BY a ORDER BY b) AS r FROM t'
    """
    for select in list(tree.find_all(exp.Select)):
        definitions = {w.this.name.lower(): w for w in select.args.get("windows") or []}
        if not definitions:
            continue
        for window in list(select.find_all(exp.Window)):
            name = window.args.get("alias")
            if name is None or window.find_ancestor(exp.Select) is not select:
                continue
            if isinstance(window.this, exp.Identifier):
                continue  # a definition itself, dropped below
            for part, value in _definition(model, name.name, definitions, ()).items():
                if value is not None and window.args.get(part) is None:
                    window.set(part, value.copy())
            window.set("alias", None)
        select.set("windows", None)
    return tree


def _definition(
    model: str, name: str, definitions: dict[str, exp.Window], seen: tuple[str, ...]
) -> dict[str, exp.Expr | list | None]:
    """The PARTITION BY, ORDER BY and frame a named window stands for (it may name another)."""
    definition = definitions.get(name.lower())
    if definition is None or name.lower() in seen:
        raise NotMaintainable(
            model,
            f"OVER {name} without a WINDOW {name} AS (...) in its SELECT"
            if definition is None
            else f"a WINDOW clause defining {name} through itself",
            "define it in the WINDOW clause of the SELECT that uses it",
        )
    parts: dict[str, exp.Expr | list | None] = {
        part: definition.args.get(part) for part in ("partition_by", "order", "spec")
    }
    base = definition.args.get("alias")
    if base is not None:
        for part, value in _definition(
            model, base.name, definitions, (*seen, name.lower())
        ).items():
            parts[part] = parts[part] or value
    return parts


# -- windows over inputs that are not one relation ----------------------------


def needs_split(select: exp.Expr) -> bool:
    """A SELECT whose window functions read a join, groups, filtered rows or are de-duplicated.

    >>> import sqlglot
    >>> needs_split(sqlglot.parse_one("select rank() over (order by b) from t join u on t.a = u.a"))
    True
    >>> needs_split(sqlglot.parse_one("select rank() over (order by b) from t where b > 0"))
    False
    """
    if not isinstance(select, exp.Select) or not windows_of(select):
        return False
    distinct = select.args.get("distinct")
    if distinct is not None and (select.args.get("order") or distinct.args.get("on")):
        # A top-k of distinct windows' rows, or DISTINCT ON: refused as they are.
        return False
    return bool(
        select.args.get("distinct")
        or _is_grouped(select)
        or select.args.get("joins")
        or len(from_tables(select)) != 1
        or subquery_predicates(select)
    )


def split_inputs(query: exp.Query) -> exp.Query:
    """The query with each window's input that needs it (needs_split) a CTE of its own.

    `query` is qualified, its mergeable CTEs and subqueries merged (nodes.py);
    a new CTE comes right before the CTE (or the outer SELECT) that reads it.
    """
    query = query.copy()
    with_ = query.args.get("with_")
    ctes = list(with_.expressions) if with_ is not None else []
    query.set("with_", None)  # the split parts are copies of the query: without its CTEs
    taken = {cte.alias_or_name.lower() for cte in ctes}
    ordered: list[exp.CTE] = []
    for cte in ctes:
        added, body = _split(cte.this, taken)
        cte.set("this", body)
        ordered += [*added, cte]
    added, outer = _split(query, taken)
    ordered += added
    if ordered:
        outer.set("with_", exp.With(expressions=ordered))
    assert isinstance(outer, exp.Query)
    return outer


def _split(query: exp.Expr, taken: set[str]) -> tuple[list[exp.CTE], exp.Expr]:
    """(the new CTEs, the query reading the last of them); ([], query) when none is needed."""
    if not needs_split(query):
        return [], query
    assert isinstance(query, exp.Select)
    if query.args.get("distinct"):
        return _distinct_over_windows(query, taken)
    if _is_grouped(query):
        return _windows_over_groups(query, taken)
    return _windows_over_rows(query, taken)


def _distinct_over_windows(select: exp.Select, taken: set[str]) -> tuple[list[exp.CTE], exp.Select]:
    """SELECT DISTINCT over the windows' rows: the windows (maybe split further) as a node."""
    windows = select.copy()
    windows.set("distinct", None)
    names = _unique_names(p.alias_or_name for p in windows.expressions)
    windows.set(
        "expressions",
        [
            exp.alias_(p.unalias().copy(), name, quoted=True)
            for p, name in zip(windows.expressions, names)
        ],
    )
    ctes, split = _split(windows, taken)
    name = _cte_name(ROWS_CTE, taken)
    outer = exp.select(
        *[
            exp.alias_(exp.column(column, table=name, quoted=True), p.alias_or_name, quoted=True)
            for p, column in zip(select.expressions, names)
        ]
    ).distinct()
    outer.set("from_", exp.From(this=_table(name)))
    return [*ctes, _cte(name, split)], outer


def _windows_over_groups(select: exp.Select, taken: set[str]) -> tuple[list[exp.CTE], exp.Select]:
    """The groups as a node: a column per GROUP BY expression and per aggregate outside windows."""
    name = _cte_name(INPUT_CTE, taken)
    group = select.args.get("group")
    computed: dict[str, exp.Expr] = {}  # the node's column per expression, by its SQL
    for expression in group.expressions if group is not None else []:
        computed.setdefault(expression.sql(dialect=DIALECT), expression)
    for aggregate in (a for p in _reading(select) for a in _group_aggregates(p)):
        computed.setdefault(aggregate.sql(dialect=DIALECT), aggregate)
    # A plain column keeps its name; other expressions are numbered by kind.
    proposed = []
    numbered = {"group": 0, "aggregate": 0}
    for expression in computed.values():
        if isinstance(expression, exp.Column):
            proposed.append(expression.name)
            continue
        kind = "aggregate" if isinstance(expression, exp.AggFunc) else "group"
        numbered[kind] += 1
        proposed.append(f"{kind}_{numbered[kind]}")
    names = dict(zip(computed, _unique_names(proposed)))

    def replace(node: exp.Expr) -> exp.Expr:
        written = node.sql(dialect=DIALECT)
        if (
            written in names
            and not isinstance(node, (exp.Window, exp.Alias))
            and not (isinstance(node, exp.AggFunc) and _is_window_function(node))
        ):
            return exp.column(names[written], table=name, quoted=True)
        return node

    inner = _without_row_order(select)
    inner.set(
        "expressions",
        [exp.alias_(e.copy(), names[key], quoted=True) for key, e in computed.items()]
        or [exp.alias_(exp.Literal.number(1), "group_present", quoted=True)],
    )
    outer = select.copy()
    outer.set("expressions", [p.transform(replace) for p in select.expressions])
    if select.args.get("order") is not None:  # a top-k's ORDER BY (view_classes/top_k.py)
        outer.set("order", select.args["order"].transform(replace))
    for clause in ("joins", "where", "group", "having"):
        outer.set(clause, None)
    outer.set("from_", exp.From(this=_table(name)))
    return [_cte(name, inner)], outer


def _windows_over_rows(select: exp.Select, taken: set[str]) -> tuple[list[exp.CTE], exp.Select]:
    """The FROM, JOINs and WHERE as a node of the columns the SELECT list reads."""
    name = _cte_name(INPUT_CTE, taken)
    # Not the output names a top-k's ORDER BY may use: those have no table.
    read = list(
        {
            c.sql(dialect=DIALECT): c
            for p in _reading(select)
            for c in p.find_all(exp.Column)
            if c.table
        }.values()
    )
    plain = [c.name for c in read]
    proposed = [c.name if plain.count(c.name) == 1 else f"{c.table}_{c.name}" for c in read]
    names = dict(zip((c.sql(dialect=DIALECT) for c in read), _unique_names(proposed)))
    inner = _without_row_order(select)
    inner.set(
        "expressions",
        [exp.alias_(c.copy(), names[c.sql(dialect=DIALECT)], quoted=True) for c in read]
        or [exp.alias_(exp.Literal.number(1), "row_present", quoted=True)],
    )

    def replace(node: exp.Expr) -> exp.Expr:
        written = node.sql(dialect=DIALECT)
        if isinstance(node, exp.Column) and written in names:
            return exp.column(names[written], table=name, quoted=True)
        return node

    outer = select.copy()
    outer.set("expressions", [p.transform(replace) for p in select.expressions])
    if select.args.get("order") is not None:
        outer.set("order", select.args["order"].transform(replace))
    outer.set("joins", None)
    outer.set("where", None)
    outer.set("from_", exp.From(this=_table(name)))
    return [_cte(name, inner)], outer


# -- helpers ---------------------------------------------------------------------


def _reading(select: exp.Select) -> list[exp.Expr]:
    """The expressions evaluated over the windows' input: the SELECT list, a top-k's ORDER BY."""
    order = select.args.get("order")
    return [*select.expressions, *([order] if order is not None else [])]


def _without_row_order(select: exp.Select) -> exp.Select:
    """A copy without a top-k's ORDER BY and LIMIT: those stay on the windows' SELECT."""
    inner = select.copy()
    for clause in ("order", "limit", "offset"):
        inner.set(clause, None)
    return inner


def _is_window_function(call: exp.Expr) -> bool:
    """The function a window applies (not an aggregate inside its arguments or ORDER BY)."""
    parent = call.parent
    while isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return isinstance(parent, exp.Window) and call.arg_key == "this"


def _group_aggregates(expression: exp.Expr) -> list[exp.AggFunc]:
    """The aggregates of groups in an expression: not a window's function, not inside another."""
    found = []
    for node in expression.walk(
        prune=lambda n: isinstance(n, exp.AggFunc) and not _is_window_function(n)
    ):
        if isinstance(node, exp.AggFunc) and not _is_window_function(node):
            found.append(node)
    return found


def _is_grouped(select: exp.Select) -> bool:
    return bool(
        select.args.get("group")
        or select.args.get("having")
        or any(_group_aggregates(p) for p in select.expressions)
    )


def _unique_names(proposed: Iterable[str]) -> list[str]:
    """Each name once (Spark's column names are case-insensitive), in order: a repeat gets `_<n>`.

    >>> _unique_names(["a", "b", "a", "A"])
    ['a', 'b', 'a_2', 'A_3']
    """
    names: list[str] = []
    used: set[str] = set()
    for name in proposed:
        candidate, n = name, 1
        while candidate.lower() in used:
            n += 1
            candidate = f"{name}_{n}"
        used.add(candidate.lower())
        names.append(candidate)
    return names


def _cte_name(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _table(name: str) -> exp.Table:
    return exp.Table(
        this=exp.to_identifier(name, quoted=True),
        alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)),
    )


def _cte(name: str, body: exp.Expr) -> exp.CTE:
    return exp.CTE(this=body, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))
