"""Names of the bookkeeping columns the compiler adds to maintained tables.

Every internal name starts with one reserved prefix, so users and tests can tell
bookkeeping from model columns, and the compiler can refuse models whose own
columns would collide with it.
"""

RESERVED_PREFIX = "__ivm_"

# `<model>__ivm_state`: the Delta table behind an ivm model's view.
STATE_SUFFIX = f"{RESERVED_PREFIX}state"

COUNT = f"{RESERVED_PREFIX}count"  # multiplicity of the row / number of rows in the group
SIGN = f"{RESERVED_PREFIX}sign"  # +1 / -1 on a change-feed row
COPY = f"{RESERVED_PREFIX}copy"  # the exploded copy index when a bag view repeats a row
TARGET_ALIAS = f"{RESERVED_PREFIX}t"
CHANGE_ALIAS = f"{RESERVED_PREFIX}d"  # the MERGE source: one change per state row
COPIES_ALIAS = f"{RESERVED_PREFIX}copies"
# The guard row's column: NULL on every other row; on the state's one guard row,
# the id of the refresh that last committed to the state. Every MERGE checks it
# equals the id the refresh read and sets its own (emit.Guard).
GUARD = f"{RESERVED_PREFIX}guard"
GUARDED_ALIAS = f"{RESERVED_PREFIX}guarded"  # the MERGE source before its guard check
GUARD_CHECK_ALIAS = f"{RESERVED_PREFIX}check"  # the guard source row joined to it
BUILT_ALIAS = f"{RESERVED_PREFIX}built"  # create_state's model rows, before the guard row


def group_key(index: int) -> str:
    return f"{RESERVED_PREFIX}g{index}"


def sum_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}sum_a{argument_index}"


def non_null_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}nn_a{argument_index}"


# A floating-point argument's non-finite values, counted apart from its sum
# and moments (rules/floating.py).
def nan_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}nan_a{argument_index}"


def positive_infinity_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}pinf_a{argument_index}"


def negative_infinity_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}ninf_a{argument_index}"


def sum_error_of(argument_index: int) -> str:
    """The rounding error of a floating-point sum's column, kept to add back (rules/floating.py)."""
    return f"{RESERVED_PREFIX}err_a{argument_index}"


def sum_magnitude_of(argument_index: int) -> str:
    """A floating-point argument's absolute values summed over the group's rows (rules/floating.py)."""
    return f"{RESERVED_PREFIX}abs_a{argument_index}"


def sum_mass_of(argument_index: int) -> str:
    """The absolute values a floating-point sum took in through SUMs that may have rounded."""
    return f"{RESERVED_PREFIX}mass_a{argument_index}"


# An argument's moments (rules/moments.py): the count, mean and sum of squared
# deviations of its finite values; and on change rows, those of the inserted
# values (under the same names and `added_count_of`) and of the removed ones.
def moment_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}mn_a{argument_index}"


def mean_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}mean_a{argument_index}"


def squared_deviations_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}m2_a{argument_index}"


def added_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}mn_added_a{argument_index}"


def removed_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}mn_removed_a{argument_index}"


def removed_mean_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}mean_removed_a{argument_index}"


def removed_squared_deviations_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}m2_removed_a{argument_index}"


# The co-moment of two arguments (rules/covariance.py): sum((x - mean x)(y - mean y))
# over the rows where both are finite; on change rows, the inserted rows' under
# the same name and the removed rows'.
def co_moment_of(x_index: int, y_index: int) -> str:
    return f"{RESERVED_PREFIX}c2_a{x_index}_a{y_index}"


def removed_co_moment_of(x_index: int, y_index: int) -> str:
    return f"{RESERVED_PREFIX}c2_removed_a{x_index}_a{y_index}"


# The MERGE's source of a model with moments (merge_source.py): the change rows
# joined with their stored rows, each intermediate of the merge a column.
MERGING_ALIAS = f"{RESERVED_PREFIX}merging"
STORED_ALIAS = f"{RESERVED_PREFIX}stored"


def stored_value_of(column: str) -> str:
    """A state column's stored value, beside the change row that merges into it."""
    return f"{column}_stored"


def merge_step_of(step: str, argument_index: int) -> str:
    """One of an argument's counts or means through the merge (moments.MergedCounts fields)."""
    return f"{RESERVED_PREFIX}merge_{step}_a{argument_index}"


# True on a change row whose removal cancels its group's moments
# (rules/moments.cancels): the MERGE then fails, and the model is recomputed.
CANCELLED = f"{RESERVED_PREFIX}cancelled"
# TRUE on a MERGE source row that replaces its group's state row: the group
# recomputed from the sources because its removal cancelled (merge_source.py).
REPLACING = f"{RESERVED_PREFIX}replacing"
MERGING_ROWS_ALIAS = f"{RESERVED_PREFIX}merging_rows"
CANCELLED_KEYS_ALIAS = f"{RESERVED_PREFIX}cancelled_keys"


def merged_value_of(column: str) -> str:
    """A MOMENT or CO_MOMENT column's value after the merge, which the MERGE sets."""
    return f"{column}_merged"


def is_reserved(name: str) -> bool:
    return name.lower().startswith(RESERVED_PREFIX)


ROWS_ALIAS = f"{RESERVED_PREFIX}rows"  # the model's FROM/JOIN/WHERE rows, flattened
CHANGES_CTE = f"{RESERVED_PREFIX}changes"  # the signed change rows of one refresh
# The temporary view a refresh caches its signed change rows in (emit.stage_changes).
STAGED_PREFIX = f"{RESERVED_PREFIX}staged_"
# 0 on a group's row, the pre-aggregation's slot on its (group, value, count) rows.
SLOT = f"{RESERVED_PREFIX}slot"
PREAGG_ALIAS = f"{RESERVED_PREFIX}p"
UPSTREAM_CHANGES_ALIAS = f"{RESERVED_PREFIX}uc"  # an upstream ivm model's state changes
# An overwritten upstream's view rows with their signs, and their sum per row
# (reads.signed_changes consolidates them).
OVERWRITTEN_ALIAS = f"{RESERVED_PREFIX}overwritten"
NET_ALIAS = f"{RESERVED_PREFIX}net"
NET_SIGN = f"{RESERVED_PREFIX}net_sign"
CHANGED_ROWS_ALIAS = f"{RESERVED_PREFIX}cr"  # a source's change rows, undone (reads.table_before)
# The keys a key relation's change rows hold, beside the input's own alias (reads.key_changes).
TOUCHED_KEYS_ALIAS = f"{RESERVED_PREFIX}touched"
# The one column of an upstream read only to count its rows (reads.counted_up_to).
PRESENT = f"{RESERVED_PREFIX}present"
# A changed key column's values past the list, read from its change rows (key_bounds.with_change_reads).
CHANGE_KEYS_ALIAS = f"{RESERVED_PREFIX}change_keys"
# A partner filter's input at its recorded version, signed, before its rows are
# counted (reads.rows_before); the one column of that count when the filter's
# condition reads none of the input's columns.
BEFORE_ALIAS = f"{RESERVED_PREFIX}before"
ANY = f"{RESERVED_PREFIX}any"


# A WINDOW model's recomputed partitions' rows in its MERGE's source, and TRUE
# there on a state row of those partitions that they no longer hold
# (emit._with_gone_rows).
RECOMPUTED_ALIAS = f"{RESERVED_PREFIX}recomputed"
GONE = f"{RESERVED_PREFIX}gone"

# A projection log view's rows with a negative count, by their key's hash bucket
# (log_state.view_rows).
NEGATED_ALIAS = f"{RESERVED_PREFIX}negated"
ROW_BUCKET = f"{RESERVED_PREFIX}bucket"


RANKED_ALIAS = f"{RESERVED_PREFIX}ranked"  # a top-k view's full ranking, before its LIMIT
OPERAND = f"{RESERVED_PREFIX}operand"  # which operand of a set operation a row comes from


def operand_count_of(index: int) -> str:
    """How many of a state row's copies the index-th operand of a set operation produces."""
    return f"{RESERVED_PREFIX}count_o{index}"


def is_operand_count(name: str) -> bool:
    return name.startswith(f"{RESERVED_PREFIX}count_o")


def argument(index: int) -> str:
    """The flattened value of the model's index-th distinct aggregate argument."""
    return f"{RESERVED_PREFIX}arg{index}"


def min_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}min_a{argument_index}"


def max_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}max_a{argument_index}"


def distinct_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}cd_a{argument_index}"


def _bounded(kind: str | None) -> str:
    """The suffix of a bounded pre-aggregation's names: it keeps one kind's extremes."""
    return f"_{kind.lower()}" if kind else ""


def preaggregated_value_of(argument_index: int, kind: str | None = None) -> str:
    """On argument i's pre-aggregation rows: one distinct value of the argument in the group.

    `kind`: MIN or MAX for a bounded pre-aggregation (plan.PreAggregation.kept).
    """
    return f"{RESERVED_PREFIX}pv_a{argument_index}{_bounded(kind)}"


def kept_values_of(argument_index: int, kind: str) -> str:
    """On a group's row: a bounded MIN or MAX's kept values, an array of (value, count)."""
    return f"{RESERVED_PREFIX}kv_a{argument_index}{_bounded(kind)}"


# The fields of a kept value (kept_values_of).
KEPT_VALUE = "v"
KEPT_COUNT = "n"


def preaggregation_cte(argument_index: int, kind: str | None = None) -> str:
    return f"{RESERVED_PREFIX}pre_a{argument_index}{_bounded(kind)}"


def recomputed_cte(argument_index: int, kind: str | None = None) -> str:
    return f"{RESERVED_PREFIX}new_a{argument_index}{_bounded(kind)}"


def kept_values_cte(argument_index: int, kind: str) -> str:
    """A bounded pre-aggregation's touched groups' values, each with what the state keeps of it."""
    return f"{RESERVED_PREFIX}kept_a{argument_index}{_bounded(kind)}"


def touched_flag_of(argument_index: int, kind: str | None = None) -> str:
    """On a change row: TRUE when the refresh changed argument i's values in the group."""
    return f"{RESERVED_PREFIX}touched_a{argument_index}{_bounded(kind)}"


# On a group's change row: TRUE when a bounded pre-aggregation of the group
# keeps none of its values while the group still has some (rules/extremes.py).
EXHAUSTED = f"{RESERVED_PREFIX}exhausted"


def join_key(index: int) -> str:
    """The index-th column of an outer join's key relation (plan.KeyRelation)."""
    return f"{RESERVED_PREFIX}k{index}"


def key_relation(join_index: int) -> str:
    """The alias of the key relation of the model's join_index-th JOIN."""
    return f"{RESERVED_PREFIX}keys{join_index}"


def semi_key_relation(predicate_index: int, role: str) -> str:
    """The alias of a key relation of the model's predicate_index-th semi or anti join.

    role: "keys" (the correlation and IN keys), "null" (NOT IN: the subquery
    has a NULL) or "rows" (NOT IN: the subquery has a row).
    """
    return f"{RESERVED_PREFIX}semi{predicate_index}_{role}"


def partner_alias(input_index: int, role: str) -> str:
    """The alias of a changed partner filter's input in one of the three joins of its change.

    role: "change" (its change rows), "now" (its pinned version) or "then"
    (its recorded version); changes.signed_rows joins each to the term's rows.
    """
    return f"{RESERVED_PREFIX}partner{input_index}_{role}"


def subquery_alias(predicate_index: int) -> str:
    """The alias a subquery's table takes when its own alias is taken by the outer query."""
    return f"{RESERVED_PREFIX}sq{predicate_index}"
