"""LEFT, RIGHT and FULL joins as signed sums of inner joins.

An outer join is not linear in its null-supplying input: a row of the
preserved side is padded with NULLs exactly while it has no partner, so the
first partner to arrive removes a padded row, and the last to go brings it
back. With K(R), the distinct join keys that have at least one partner,

    L LEFT JOIN R ON l.k = r.k AND p(l) AND q(r)
      =   (L JOIN R ON l.k = r.k AND p(l) AND q(r))
        + pad(L)
        - pad(σ_p(L) JOIN K(σ_q(R)) ON l.k = K.k)

where pad(X) is X with every column of R NULL. (A row of L is padded unless
p holds and a partner exists, and K has at most one row per key, so the last
term removes each matched row's padding exactly once.) K(R) is a DISTINCT of
R, and its change is the keys that gained their first or lost their last
partner over the version range (reads.key_changes). Every term is an inner join of
inputs and key relations, so the telescoping join rule gives each term's
exact change, and their sum is the outer join's. A NULL key never matches:
K leaves NULL keys out and `=` never pairs them.

RIGHT JOIN mirrors LEFT; FULL JOIN pads both sides, with one K per side. A
chain of joins applies the rule join by join to every term so far; a term
whose join compares a padded (NULL) column can have no rows and is dropped.

Conditions that compare the two sides other than by equality
----------------------------------------------------------------

With a condition c(l, r) beside the equalities (the SCD2 point-in-time
lookup `s.k = d.k AND s.ts BETWEEN d.valid_from AND d.valid_to`, or a band
with no equality at all), whether a row of L is padded depends on the row,
not on its key, and K cannot stand for it. The padded rows are then L's rows
that have no partner under the whole condition θ, an anti join:

    L LEFT JOIN R ON θ  =  (L JOIN R ON θ) + pad(L ▷_θ R)

and the padding term is a term with a partner filter (plan.PartnerFilter):
its rows are kept while they have no partner in R. An anti join is linear in
L (it filters L row by row), so the term's change is, with the filter as its
last input (changes.signed_rows),

    d pad(L ▷_θ R) =  pad(dL ▷_θ R_before)
                    + pad(L' ⋉_θ dR ▷_θ R' ⋉_θ R_before)
                    - pad(L' ⋉_θ dR ⋉_θ R' ▷_θ R_before)

where L' and R' are the inputs at the pinned versions and R_before R at the
recorded one. A row of L' without a partner among R's change rows has the
same partners before and after, so only the rows that some change row of R
partners (L' ⋉ dR) can gain or lose their padding: the second line pads the
rows that lost their last partner, the third unpads those that gained their
first. So the change reads what a change of R partners through θ, found
through the equalities when θ has some (Delta skips L's files outside the
change's key range, key_bounds.py), and through the whole condition when it
has none. R_before is read as R's distinct rows counted from its pinned
version and change rows (reads.rows_before), no old snapshot; it is read
only when R changed. An outer join whose ON holds only equalities and
conditions on one side keeps the key relation above: its terms join K by
key, which costs less than a semi join on the whole condition.

RIGHT and FULL joins must be the first join of the FROM clause, because the
padding of the left side needs the distinct keys (or, with a partner filter,
the rows) of everything joined before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.errors import NotMaintainable
from ivm_compiler.plan import JoinTerm, KeyRelation, PartnerFilter, SourceRef
from ivm_compiler.sql import DIALECT, TableName, conjunction, equality_sides, ident

OUTER_SIDES = ("LEFT", "RIGHT", "FULL")


def outer_side(join: exp.Join) -> str | None:
    """LEFT, RIGHT or FULL for an outer join; None for inner and cross joins."""
    side = (join.args.get("side") or "").upper()
    return side if side in OUTER_SIDES else None


def has_outer_join(select: exp.Select) -> bool:
    return any(outer_side(join) for join in select.args.get("joins") or [])


@dataclass(frozen=True)
class _OnCondition:
    """An outer join's ON, split: key equalities, conditions on one side alone, and the rest."""

    keys: tuple[tuple[exp.Expr, exp.Expr], ...]  # (left side, right side)
    left_only: tuple[exp.Expr, ...]
    right_only: tuple[exp.Expr, ...]
    # Conditions relating the two sides other than by an equality of the two
    # sides' expressions (comparisons, BETWEEN, expressions over both).
    across: tuple[exp.Expr, ...] = ()
    # The whole ON as written.
    whole: exp.Expr | None = None


@dataclass(frozen=True)
class _Partial:
    """A term under construction: its sign, FROM, inner JOINs so far, padded aliases, filters."""

    sign: int
    first: exp.Expr
    joins: tuple[exp.Join, ...] = ()
    padded: frozenset[str] = frozenset()
    key_relations: tuple[KeyRelation, ...] = ()
    filters: tuple[PartnerFilter, ...] = ()

    def joined(self, join: exp.Join, relation: KeyRelation | None = None) -> _Partial:
        extra = (relation,) if relation else ()
        return replace(self, joins=(*self.joins, join), key_relations=(*self.key_relations, *extra))

    def padding(self, alias: str) -> _Partial:
        return replace(self, padded=self.padded | {alias})

    def filtered(self, partner: PartnerFilter) -> _Partial:
        return replace(self, filters=(*self.filters, partner))

    def negated(self) -> _Partial:
        return replace(self, sign=-self.sign)


def expand(
    model: str,
    rows: exp.Select,
    column_types: Mapping[str, Mapping[str, str]],
    filters: tuple[PartnerFilter, ...] = (),
) -> tuple[JoinTerm, ...]:
    """The model's flattened rows as signed inner-join terms; () when FROM has no outer join.

    `column_types` gives, per alias of the FROM clause, each column's Spark
    type (lower-case names), for the typed NULLs that stand for padded columns.
    `filters`: partner filters the rows already have (semi joins on whole
    conditions, rules/semi_joins.py); each term keeps them, padded as it is.
    """
    joins = rows.args.get("joins") or []
    if not any(outer_side(join) for join in joins):
        return ()
    first = rows.args["from_"].this
    partials = [_Partial(sign=1, first=first, filters=filters)]
    left_aliases = {first.alias_or_name}
    for index, join in enumerate(joins):
        alias = join.this.alias_or_name
        side = outer_side(join)
        if side is None:
            partials = [p.joined(join.copy()) for p in partials]
        else:
            if side != "LEFT" and index > 0:
                raise NotMaintainable(
                    model,
                    f"a {side} JOIN of {alias!r} after other joins (the rows it pads "
                    "come from several inputs)",
                    "start the FROM clause with this join, write it as a LEFT JOIN with "
                    "the inputs swapped, or build the joins before it as an ivm model of "
                    "its own and ref() it",
                )
            condition = _split_on(model, join, left_aliases, alias)
            partials = [
                term for p in partials for term in _outer_terms(p, join, condition, index, side)
            ]
        left_aliases.add(alias)
    terms = []
    for partial in partials:
        term = _term(rows, partial, column_types)
        if term is not None:
            terms.append(term)
    return tuple(terms)


def _outer_terms(
    partial: _Partial, join: exp.Join, on: _OnCondition, index: int, side: str
) -> list[_Partial]:
    right = join.this
    right_alias = right.alias_or_name
    inner = exp.Join(this=right.copy(), on=join.args["on"].copy())
    terms = [partial.joined(inner)]
    if on.across or not on.keys:
        # No key decides alone whether a row has a partner.
        return terms + _filtered_padding(partial, join, on, side)
    if side in ("LEFT", "FULL"):
        # The preserved left rows, padded, minus those that have a partner.
        keys = KeyRelation(
            alias=names.key_relation(index),
            source=SourceRef(alias=right_alias, table=TableName.of(right)),
            keys=tuple(r.copy() for _, r in on.keys),
            condition=conjunction(on.right_only),
        )
        matched = key_join(keys, [left for left, _ in on.keys], on.left_only)
        terms.append(partial.padding(right_alias))
        terms.append(partial.padding(right_alias).joined(matched, keys).negated())
    if side in ("RIGHT", "FULL"):
        # Only as the first join: the left side is the single input `partial.first`.
        left = partial.first
        left_alias = left.alias_or_name
        keys = KeyRelation(
            alias=names.key_relation(index) + "_left",
            source=SourceRef(alias=left_alias, table=TableName.of(left)),
            keys=tuple(left_key.copy() for left_key, _ in on.keys),
            condition=conjunction(on.left_only),
        )
        padded_left = replace(partial, first=right.copy(), padded=partial.padded | {left_alias})
        matched = key_join(keys, [r for _, r in on.keys], on.right_only)
        terms.append(padded_left)
        terms.append(padded_left.joined(matched, keys).negated())
    return terms


def _filtered_padding(
    partial: _Partial, join: exp.Join, on: _OnCondition, side: str
) -> list[_Partial]:
    """The padded rows of an ON that compares the sides other than by equality: anti joins.

    pad(L ▷_θ R) for LEFT, pad(R ▷_θ L) for RIGHT, both for FULL (the
    module's docstring); the preserved side's rows that have no partner
    under the whole ON.
    """
    assert on.whole is not None
    right = join.this
    terms = []
    if side in ("LEFT", "FULL"):
        unmatched = PartnerFilter(
            source=SourceRef(alias=right.alias_or_name, table=TableName.of(right)),
            condition=on.whole.copy(),
            anti=True,
        )
        terms.append(partial.padding(right.alias_or_name).filtered(unmatched))
    if side in ("RIGHT", "FULL"):
        # Only as the first join: the left side is the single input `partial.first`.
        left = partial.first
        unmatched = PartnerFilter(
            source=SourceRef(alias=left.alias_or_name, table=TableName.of(left)),
            condition=on.whole.copy(),
            anti=True,
        )
        padded_left = replace(
            partial, first=right.copy(), padded=partial.padded | {left.alias_or_name}
        )
        terms.append(padded_left.filtered(unmatched))
    return terms


def key_join(
    keys: KeyRelation,
    preserved_keys: list[exp.Expr],
    preserved_only: tuple[exp.Expr, ...],
) -> exp.Join:
    """JOIN <key relation> ON each preserved-side key = its key column AND the side's own conditions.

    Semi joins join their key relations the same way (rules/semi_joins.py).

    >>> keys = KeyRelation("__ivm_keys0", SourceRef("c", TableName("s", "c")), (), None)
    >>> key_join(keys, [exp.column("k", table="o")], ()).sql(dialect=DIALECT)
    'JOIN `__ivm_keys0` AS `__ivm_keys0` ON o.k = `__ivm_keys0`.`__ivm_k0`'
    """
    equalities = [
        exp.EQ(
            this=key.copy(),
            expression=exp.column(names.join_key(i), table=ident(keys.alias), quoted=True),
        )
        for i, key in enumerate(preserved_keys)
    ]
    return exp.Join(
        this=exp.Table(this=ident(keys.alias), alias=exp.TableAlias(this=ident(keys.alias))),
        on=exp.and_(*equalities, *[c.copy() for c in preserved_only]),
    )


def _split_on(model: str, join: exp.Join, left_aliases: set[str], right_alias: str) -> _OnCondition:
    on = join.args.get("on")
    written = f"{outer_side(join)} JOIN of {right_alias!r}"
    if on is None:
        raise NotMaintainable(
            model,
            f"a {written} without an ON condition",
            "join on equalities of the two sides' columns, e.g. ON a.id = b.id",
        )
    keys, left_only, right_only, across = [], [], [], []
    for conjunct in on.flatten() if isinstance(on, exp.And) else [on]:
        used = exp.column_table_names(conjunct)
        if used <= {right_alias} and used:
            right_only.append(conjunct)
        elif used <= left_aliases:
            left_only.append(conjunct)
        elif (pair := equality_sides(conjunct, left_aliases, right_alias)) is not None:
            keys.append(pair)
        else:
            across.append(conjunct)
    return _OnCondition(
        keys=tuple(keys),
        left_only=tuple(left_only),
        right_only=tuple(right_only),
        across=tuple(across),
        whole=on,
    )


def _term(
    rows: exp.Select, partial: _Partial, column_types: Mapping[str, Mapping[str, str]]
) -> JoinTerm | None:
    """The term: the rows' columns and WHERE over its inner joins, then its filters; None when empty."""
    select = rows.copy()
    select.set("from_", exp.From(this=partial.first.copy()))
    select.set("joins", [join.copy() for join in partial.joins] or None)

    def padding(kept: str | None = None) -> Callable[[exp.Expr], exp.Expr]:
        padded = partial.padded - {kept} if kept else partial.padded

        def pad(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.table in padded:
                data_type = column_types[node.table][node.name.lower()]
                return exp.Cast(this=exp.Null(), to=exp.DataType.build(data_type, dialect=DIALECT))
            return node

        return pad

    padded = select.transform(padding())
    assert isinstance(padded, exp.Select)  # pad replaces columns only, never the root
    select = padded
    for join in select.args.get("joins") or []:
        if _never_true(join.args.get("on")):
            # An equality with a padded column is never true: the term has no rows.
            return None
    filters = []
    for partner in partial.filters:
        # A filter's condition reads its own input's columns (the padding of
        # an outer join's null-supplying side stands beside its filter), and
        # NULLs for the other padded inputs.
        condition = partner.condition.transform(padding(kept=partner.source.alias))
        if _never_true(condition):
            if not partner.anti:
                return None  # no row has a partner: a semi join keeps none
            continue  # and an anti join keeps every row
        filters.append(replace(partner, condition=condition))
    return JoinTerm(
        sign=partial.sign,
        rows=select,
        key_relations=partial.key_relations,
        filters=tuple(filters),
    )


def _never_true(condition: exp.Expr | None) -> bool:
    """One of the condition's conjuncts is an equality with a padded (NULL) column."""
    conjuncts = (
        condition.flatten() if isinstance(condition, exp.And) else [condition] if condition else []
    )
    return any(
        isinstance(c, exp.EQ) and (_is_null(c.this) or _is_null(c.expression)) for c in conjuncts
    )


def _is_null(node: exp.Expr) -> bool:
    return isinstance(node, exp.Null) or (
        isinstance(node, exp.Cast) and isinstance(node.this, exp.Null)
    )
