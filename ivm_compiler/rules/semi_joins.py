"""EXISTS, NOT EXISTS, IN, NOT IN and LEFT SEMI/ANTI JOIN as signed sums of inner joins.

A semi join keeps a row while it has at least one partner, so it is not
linear in the subquery's input: a row appears when its first partner arrives
and disappears when its last one goes. With K(R), the distinct non-NULL keys
of the subquery's rows (the key relations of rules/outer_joins.py),

    L ⋉ R  =  L ⋈ K(R)              (EXISTS, IN, LEFT SEMI JOIN)
    L ▷ R  =  L - L ⋈ K(R)          (NOT EXISTS, LEFT ANTI JOIN)

K has one row per key, so each row of L joins it at most once, and its
change is the keys that gained their first or lost their last partner
(reads.key_changes). A NULL key never matches: K leaves NULL keys out
and `=` never pairs them. The keys are the subquery's equalities with the
outer query (its correlation), then, for IN, the compared columns; a
subquery without correlation has the one key TRUE, so K(R) is one row while
R has any and none otherwise.

`x NOT IN (SELECT y FROM R WHERE q)` is Spark's null-aware anti join: a row
passes when the subquery is empty; otherwise only when x is not NULL, no y
is NULL and no y equals x. With S the subquery's rows (per correlation key),
E = K(S) (S has a row), N = K(S where y IS NULL) (S has a NULL) and
M = K over (correlation, y) (x has a partner):

    pass = [x not NULL] (1 - [N]) (1 - [M]) + [x NULL] (1 - [E])

(when S is empty the first product is [x not NULL], the second [x NULL]),
which expands to the inner-join terms

    + L  - L ⋈ M  - σ(x NULL) L ⋈ E  - σ(x not NULL) L ⋈ N  + L ⋈ N ⋈ M

(the last two are left out when the subquery has `y IS NOT NULL`: N is empty).

Conditions of the subquery on its own table go into the key relation;
conditions on the outer row alone go into the ON of its join with K (a row
failing them has an empty subquery).

A subquery correlated other than by equalities (`d.valid_from <= s.ts`)
has no key that decides alone whether a row has a partner: the semi or anti
join is then a partner filter on its whole condition (plan.PartnerFilter),
whose change is the rows whose answer the subquery's change turns, found
through the change rows (rules/outer_joins.py derives it for the padding of
an outer join, which is the same anti join). NOT IN keeps its NULL rules
there by its anti join's condition `x = y OR (x = y) IS NULL`, as the build
writes it.

The build reads the same rows with Spark's own LEFT SEMI and LEFT ANTI joins
(NOT IN's anti join matches when x = y is true or NULL), appended after the
model's joins: a semi join only filters the rows of the inputs before it, so
it commutes with the joins and filters that follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.plan import JoinTerm, KeyRelation, PartnerFilter, SourceRef
from ivm_compiler.rules import outer_joins
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    conjunction,
    conjuncts,
    equality_sides,
    from_tables,
)

# -- recognising them in WHERE ---------------------------------------------------

SUBQUERY_PREDICATES = "EXISTS, NOT EXISTS, IN and NOT IN"


@dataclass(frozen=True)
class SubqueryPredicate:
    """A top-level conjunct of a WHERE clause that tests a subquery: EXISTS, NOT EXISTS, IN, NOT IN."""

    # The conjunct itself (NOT included), to remove it from the WHERE clause.
    conjunct: exp.Expr
    # "EXISTS", "NOT EXISTS", "IN" or "NOT IN".
    kind: str
    subquery: exp.Select
    # IN and NOT IN only: the tested outer expressions, one per subquery column.
    tested: tuple[exp.Expr, ...] = ()

    @property
    def negated(self) -> bool:
        return self.kind.startswith("NOT")

    @property
    def a_kind(self) -> str:
        """The kind with its article, for messages: an EXISTS, a NOT IN."""
        return ("a " if self.negated else "an ") + self.kind


def where_conjuncts(select: exp.Expr) -> list[exp.Expr]:
    """The top-level AND-ed conditions of a SELECT's WHERE clause (parentheses removed)."""
    where = select.args.get("where")
    return conjuncts(where.this) if where is not None else []


def subquery_predicate(conjunct: exp.Expr) -> SubqueryPredicate | None:
    """The conjunct as an EXISTS/IN test of a single SELECT, or None."""
    negated = isinstance(conjunct, exp.Not)
    test = conjunct.this.unnest() if negated else conjunct
    prefix = "NOT " if negated else ""
    if isinstance(test, exp.Exists) and isinstance(test.this, exp.Select):
        return SubqueryPredicate(conjunct, f"{prefix}EXISTS", test.this)
    query = test.args.get("query") if isinstance(test, exp.In) else None
    if query is None:
        return None
    select = query.this if isinstance(query, exp.Subquery) else query
    if not isinstance(select, exp.Select):
        return None
    outer = test.this.unnest()
    tested = tuple(outer.expressions) if isinstance(outer, exp.Tuple) else (outer,)
    return SubqueryPredicate(conjunct, f"{prefix}IN", select, tested)


def subquery_predicates(select: exp.Query) -> list[SubqueryPredicate]:
    return [p for c in where_conjuncts(select) if (p := subquery_predicate(c)) is not None]


# -- refusing what they cannot stand for ------------------------------------------


def check(model: str, root: exp.Query, in_set_operation: bool) -> set[int]:
    """Check the root's EXISTS/IN conjuncts; return the ids of the subquery nodes they allow.

    parse.py asks, before qualification. Every other subquery in an expression
    is refused by parse.py, those nested in or beside a predicate here with a
    message of their own.
    """
    predicates = subquery_predicates(root)
    allowed: set[int] = set()
    for predicate in predicates:
        if in_set_operation:
            raise NotMaintainable(
                model,
                f"{predicate.a_kind} subquery inside an operand of a set operation",
                "build that operand as an ivm model of its own and ref() it, or " + FALLBACK_HINT,
            )
        _check_shape(model, predicate)
        allowed.add(id(predicate.subquery))
        if isinstance(predicate.subquery.parent, exp.Subquery):
            allowed.add(id(predicate.subquery.parent))
    where = root.args.get("where")
    for node in where.find_all(exp.Exists, exp.In) if where else []:
        query = node.this if isinstance(node, exp.Exists) else node.args.get("query")
        if query is not None and id(query) not in allowed:
            raise NotMaintainable(
                model,
                f"an EXISTS or IN subquery under OR, NOT or another expression "
                f"({node.sql(dialect=DIALECT)[:80]})",
                f"make each {SUBQUERY_PREDICATES} test a condition of its own in WHERE, joined "
                "to the others with AND (an OR of two tests can be a UNION of two models), or "
                + FALLBACK_HINT,
            )
    return allowed


def _check_shape(model: str, predicate: SubqueryPredicate) -> None:
    """One table, filtered: what a semi join against its distinct keys can stand for.

    A refresh makes a subquery of another shape a plan node first
    (subquery_inputs.py, through nodes.split_nodes), so the join, CTE,
    aggregate and nesting refusals below only meet a query compiled
    without its nodes split off.
    """
    select, kind, a_kind = predicate.subquery, predicate.kind, predicate.a_kind
    build_it = (
        "build the subquery as an ivm model of its own and ref() it inside the "
        f"{kind}, or " + FALLBACK_HINT
    )
    relations = from_tables(select)
    if select.args.get("with_") or len(relations) != 1 or not isinstance(relations[0], exp.Table):
        raise NotMaintainable(
            model, f"{a_kind} subquery that reads a join, a CTE or a derived table", build_it
        )
    if (
        select.args.get("group")
        or select.args.get("having")
        or any(p.find(exp.AggFunc) for p in select.expressions)
    ):
        raise NotMaintainable(model, f"{a_kind} subquery that aggregates", build_it)
    for clause, written in (("limit", "LIMIT"), ("offset", "OFFSET")):
        if select.args.get(clause):
            raise NotMaintainable(
                model,
                f"{written} in {a_kind} subquery (which rows it keeps depends on their order)",
                "remove it, or " + FALLBACK_HINT,
            )
    nested = next(
        (n for n in select.find_all(exp.Select, exp.Subquery) if n is not select),
        None,
    )
    if nested is not None:
        raise NotMaintainable(
            model,
            f"a subquery nested inside {a_kind} subquery",
            "build the inner part as an ivm model of its own and ref() it, or " + FALLBACK_HINT,
        )
    if kind == "NOT IN" and len(predicate.tested) > 1:
        raise NotMaintainable(
            model,
            "NOT IN over several columns (its NULL rules compare the columns one by one)",
            "write NOT EXISTS with an equality per column if the columns are never NULL, or "
            + FALLBACK_HINT,
        )
    if predicate.tested and len(predicate.tested) != len(select.expressions):
        raise NotMaintainable(
            model,
            f"{kind} comparing {len(predicate.tested)} values with a subquery of "
            f"{len(select.expressions)} columns",
            "select exactly the compared columns in the subquery",
        )


# -- the semi joins of a model ----------------------------------------------------


@dataclass(frozen=True)
class SemiJoin:
    """One semi or anti join of the model, however it was written."""

    # How the model writes it, for messages: "EXISTS", "NOT IN", "LEFT SEMI JOIN"...
    written: str
    # The subquery's (or joined) table, under an alias no other input of the model uses.
    table: exp.Table
    # (outer expression, subquery expression) pairs that must be equal: the
    # correlation, then IN's compared columns.
    keys: tuple[tuple[exp.Expr, exp.Expr], ...]
    # Conditions on the outer row alone, and on the subquery's row alone.
    outer_only: tuple[exp.Expr, ...]
    inner_only: tuple[exp.Expr, ...]
    # A row passes while it has no partner (NOT EXISTS, NOT IN, LEFT ANTI JOIN).
    anti: bool
    # NOT IN only: (x, y), compared with NULL-aware rules.
    null_aware: tuple[exp.Expr, exp.Expr] | None = None
    # Conditions relating the outer row and the subquery's row other than by
    # an equality (a partner filter, not a key relation, then keeps the rows).
    across: tuple[exp.Expr, ...] = ()

    @property
    def alias(self) -> str:
        return self.table.alias_or_name


def is_semi_or_anti(join: exp.Join) -> bool:
    return (join.args.get("kind") or "").upper() in ("SEMI", "ANTI")


def has_semi_join(select: exp.Select) -> bool:
    return bool(subquery_predicates(select)) or any(
        is_semi_or_anti(join) for join in select.args.get("joins") or []
    )


def joins_as_exists(model: str, tree: exp.Expr) -> exp.Expr:
    """The query with each LEFT SEMI/ANTI JOIN written as EXISTS/NOT EXISTS in WHERE.

    `a LEFT SEMI JOIN b ON c` keeps the rows of `a` for which some row of `b`
    satisfies `c`, which is `WHERE EXISTS (SELECT 1 FROM b WHERE c)`; a semi
    join only filters the rows before it, so it commutes with the joins and
    filters after it, except a RIGHT or FULL join, which pads rows it removed.
    """
    if not isinstance(tree, exp.Select) or not any(
        is_semi_or_anti(j) for j in tree.args.get("joins") or []
    ):
        return tree
    select = tree.copy()
    kept: list[exp.Join] = []
    tests: list[exp.Expr] = []
    for join in select.args.get("joins") or []:
        if not is_semi_or_anti(join):
            if tests and outer_joins.outer_side(join) in ("RIGHT", "FULL"):
                raise NotMaintainable(
                    model,
                    f"a {outer_joins.outer_side(join)} JOIN after a LEFT SEMI or LEFT ANTI JOIN",
                    "start the FROM clause with the outer join, or build the semi join as an "
                    "ivm model of its own and ref() it",
                )
            kept.append(join)
            continue
        kind = join.args["kind"].upper()
        written = f"LEFT {kind} JOIN of {join.this.alias_or_name!r}"
        if not isinstance(join.this, exp.Table):
            raise NotMaintainable(
                model,
                f"a {written} of a derived table",
                "join a source or ref() of an ivm model directly, or " + FALLBACK_HINT,
            )
        if join.args.get("using"):
            raise NotMaintainable(
                model,
                f"a {written} with USING",
                "write the equalities in ON, e.g. ON a.id = b.id",
            )
        subquery = exp.select(exp.Literal.number(1)).from_(join.this.copy())
        if join.args.get("on") is not None:
            subquery = subquery.where(join.args["on"].copy())
        # Refusals name the join as the model writes it (sqlglot copies meta).
        subquery.meta["written"] = written
        exists: exp.Expr = exp.Exists(this=subquery)
        tests.append(exp.Not(this=exists) if kind == "ANTI" else exists)
    select.set("joins", kept or None)
    where = select.args.get("where")
    condition = exp.and_(*tests, *([where.this.copy()] if where else []))
    select.set("where", exp.Where(this=condition))
    return select


def extract(model: str, select: exp.Select) -> tuple[exp.Select, tuple[SemiJoin, ...]]:
    """The qualified SELECT without its EXISTS/IN tests, and those tests as semi joins.

    The SELECT keeps its projections, its joins and the rest of WHERE (LEFT
    SEMI/ANTI JOINs were written as EXISTS tests before qualification,
    joins_as_exists).
    """
    plain = select.copy()
    outer_aliases = {node.alias_or_name for node in from_tables(plain)}
    taken = {alias.lower() for alias in outer_aliases}
    found: list[SemiJoin] = []
    predicates = subquery_predicates(plain)
    for predicate in predicates:
        subquery = predicate.subquery.copy()
        table = subquery.args["from_"].this
        alias = table.alias_or_name
        if alias.lower() in taken:
            # The outer query uses this name too; inside the subquery every
            # column qualified by it is the subquery's (the inner scope shadows).
            alias = names.subquery_alias(len(found))
            for column in subquery.find_all(exp.Column):
                if column.table == table.alias_or_name:
                    column.set("table", exp.to_identifier(alias, quoted=True))
            table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
        taken.add(alias.lower())
        inner = [c.copy() for c in where_conjuncts(subquery)]
        compared: list[exp.Expr] = []
        for outer, projection in zip(predicate.tested, subquery.expressions):
            value = projection.this if isinstance(projection, exp.Alias) else projection
            if not exp.column_table_names(value) <= {alias}:
                raise NotMaintainable(
                    model,
                    f"the {predicate.kind} subquery's column {value.sql(dialect=DIALECT)}, which "
                    "reads the outer query",
                    "select columns of the subquery's own table, and correlate in its WHERE",
                )
            compared.append(exp.EQ(this=outer.copy(), expression=value.copy()))
        semi = _semi_join(
            model,
            predicate.subquery.meta.get("written", predicate.kind),
            table.copy(),
            inner + (compared if predicate.kind == "IN" else []),
            outer_aliases,
            anti=predicate.negated,
        )
        if predicate.kind == "NOT IN":
            semi = replace(semi, null_aware=(compared[0].this, compared[0].expression))
        found.append(semi)
    if predicates:
        tested = {id(p.conjunct) for p in predicates}
        rest = [c.copy() for c in where_conjuncts(plain) if id(c) not in tested]
        plain.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    return plain, tuple(found)


def _semi_join(
    model: str,
    written: str,
    table: exp.Table,
    conditions: list[exp.Expr],
    outer_aliases: set[str],
    anti: bool,
) -> SemiJoin:
    """Split a semi join's conditions into key equalities and conditions on one side."""
    inner_alias = table.alias_or_name
    keys, outer_only, inner_only, across = [], [], [], []
    for conjunct in conditions:
        used = exp.column_table_names(conjunct)
        if used <= {inner_alias}:
            inner_only.append(conjunct)
        elif used <= outer_aliases:
            outer_only.append(conjunct)
        elif (pair := equality_sides(conjunct, outer_aliases, inner_alias)) is not None:
            keys.append(pair)
        elif used <= outer_aliases | {inner_alias}:
            across.append(conjunct)
        else:
            raise NotMaintainable(
                model,
                f"the condition {conjunct.sql(dialect=DIALECT)} in {written} (it reads "
                "relations that are neither the subquery's table nor the outer query's)",
                "correlate with the outer query's own inputs, or " + FALLBACK_HINT,
            )
    return SemiJoin(
        written=written,
        table=table,
        keys=tuple(keys),
        outer_only=tuple(outer_only),
        inner_only=tuple(inner_only),
        anti=anti,
        across=tuple(across),
    )


# -- the rows the build reads ----------------------------------------------------


def as_joins(rows: exp.Select, semi_joins: tuple[SemiJoin, ...]) -> exp.Select:
    """The rows with every semi and anti join as Spark's LEFT SEMI / LEFT ANTI JOIN, last."""
    if not semi_joins:
        return rows
    select = rows.copy()
    joins = list(select.args.get("joins") or [])
    for semi in semi_joins:
        conditions: list[exp.Expr] = [
            exp.EQ(this=o.copy(), expression=i.copy()) for o, i in semi.keys
        ]
        conditions += [c.copy() for c in (*semi.outer_only, *semi.inner_only, *semi.across)]
        if semi.null_aware is not None:
            # x NOT IN (... y ...) drops the row when some y compares true or NULL
            # with x. Written as Spark rewrites NOT IN itself, so that its
            # optimizer recognises a null-aware anti join (a hash join, not a
            # nested loop, when the subquery is uncorrelated).
            x, y = semi.null_aware
            compared = exp.EQ(this=x.copy(), expression=y.copy())
            conditions.append(
                exp.or_(compared, exp.Is(this=exp.paren(compared.copy()), expression=exp.Null()))
            )
        joins.append(
            exp.Join(
                this=semi.table.copy(),
                on=exp.and_(*conditions) if conditions else exp.true(),
                side="LEFT",
                kind="ANTI" if semi.anti else "SEMI",
            )
        )
    select.set("joins", joins)
    return select


# -- the signed inner-join terms of the change ------------------------------------


@dataclass(frozen=True)
class _Term:
    sign: int
    select: exp.Select
    key_relations: tuple[KeyRelation, ...] = ()
    filters: tuple[PartnerFilter, ...] = ()

    def filtered(self, partner: PartnerFilter) -> _Term:
        return replace(self, filters=(*self.filters, partner))

    def joined(self, relation: KeyRelation, outer_keys: list[exp.Expr], semi: SemiJoin):
        select = self.select.copy()
        joins = select.args.get("joins") or []
        select.set("joins", [*joins, outer_joins.key_join(relation, outer_keys, semi.outer_only)])
        return replace(self, select=select, key_relations=(*self.key_relations, relation))

    def where(self, condition: exp.Expr) -> _Term:
        return replace(self, select=self.select.copy().where(condition))

    def negated(self) -> _Term:
        return replace(self, sign=-self.sign)


def expand(
    model: str,
    rows: exp.Select,
    semi_joins: tuple[SemiJoin, ...],
    column_types: Mapping[str, Mapping[str, str]],
) -> tuple[JoinTerm, ...]:
    """The rows (without their semi joins) and the semi joins as signed inner-join terms.

    Each term's outer joins are then expanded by rules/outer_joins.py. () when
    the model has neither: its rows are linear in every input.
    """
    terms = [_Term(sign=1, select=rows.copy())]
    for index, semi in enumerate(semi_joins):
        terms = [t for term in terms for t in _terms(term, semi, index)]
    if not semi_joins and not outer_joins.has_outer_join(rows):
        return ()
    expanded = []
    for term in terms:
        outer = outer_joins.expand(model, term.select, column_types, term.filters)
        if not outer:
            expanded.append(JoinTerm(term.sign, term.select, term.key_relations, term.filters))
        for inner in outer:
            expanded.append(
                JoinTerm(
                    sign=term.sign * inner.sign,
                    rows=inner.rows,
                    key_relations=(*term.key_relations, *inner.key_relations),
                    filters=inner.filters,
                )
            )
    return tuple(expanded)


def _terms(term: _Term, semi: SemiJoin, index: int) -> list[_Term]:
    source = SourceRef(alias=semi.alias, table=TableName.of(semi.table))

    def keys(
        role: str, pairs: list[tuple[exp.Expr, exp.Expr]], *where: exp.Expr
    ) -> tuple[KeyRelation, list[exp.Expr]]:
        """The key relation of `pairs` (outer, subquery) and the outer keys that join it."""
        # Without keys the subquery is one group: the key TRUE on both sides,
        # so the relation has one row while the subquery has any.
        pairs = pairs or [(exp.true(), exp.true())]
        relation = KeyRelation(
            alias=names.semi_key_relation(index, role),
            source=source,
            keys=tuple(inner.copy() for _, inner in pairs),
            condition=conjunction([*semi.inner_only, *where]),
        )
        return relation, [outer for outer, _ in pairs]

    if semi.across:
        # No key decides alone: the rows are kept by a semi or anti join on
        # the whole condition (NOT IN's with its NULL rules, as as_joins writes it).
        (join,) = as_joins(term.select, (semi,)).args["joins"][-1:]
        partner = PartnerFilter(
            source=SourceRef(alias=semi.alias, table=TableName.of(semi.table)),
            condition=join.args["on"].copy(),
            anti=semi.anti,
        )
        return [term.filtered(partner)]
    if semi.null_aware is None:
        matched = term.joined(*keys("keys", list(semi.keys)), semi)
        return [term, matched.negated()] if semi.anti else [matched]

    x, y = semi.null_aware
    partners = keys("keys", [*semi.keys, (x, y)])
    has_rows = keys("rows", list(semi.keys))
    x_is_null = exp.Is(this=x.copy(), expression=exp.Null())
    without_null_terms = [
        term,
        term.joined(*partners, semi).negated(),
        term.where(x_is_null).joined(*has_rows, semi).negated(),
    ]
    if _never_null(y, semi.inner_only):
        # The subquery filters its NULLs out (the common `WHERE y IS NOT NULL`):
        # the relation of "has a NULL" is always empty, and so are its terms.
        return without_null_terms
    has_null = keys("null", list(semi.keys), exp.Is(this=y.copy(), expression=exp.Null()))
    return [
        *without_null_terms,
        term.where(exp.Not(this=x_is_null.copy())).joined(*has_null, semi).negated(),
        term.joined(*has_null, semi).joined(*partners, semi),
    ]


def _never_null(value: exp.Expr, conditions: tuple[exp.Expr, ...]) -> bool:
    """One of the conditions is `value IS NOT NULL`."""
    not_null = exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))
    return any(condition == not_null for condition in conditions)
