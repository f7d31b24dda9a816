"""Names of the bookkeeping columns the compiler adds to maintained tables.

Every internal name starts with one reserved prefix, so users and tests can tell
bookkeeping from model columns, and the compiler can refuse models whose own
columns would collide with it.
"""

RESERVED_PREFIX = "__ivm_"

COUNT = f"{RESERVED_PREFIX}count"  # multiplicity of the row / number of rows in the group
SIGN = f"{RESERVED_PREFIX}sign"  # +1 / -1 on a change-feed row
COPY = f"{RESERVED_PREFIX}copy"  # the exploded copy index when a bag view repeats a row
TARGET_ALIAS = f"{RESERVED_PREFIX}t"
DELTA_ALIAS = f"{RESERVED_PREFIX}d"
COPIES_ALIAS = f"{RESERVED_PREFIX}copies"


def group_key(index: int) -> str:
    return f"{RESERVED_PREFIX}g{index}"


def sum_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}sum_a{argument_index}"


def non_null_count_of(argument_index: int) -> str:
    return f"{RESERVED_PREFIX}nn_a{argument_index}"


def is_reserved(name: str) -> bool:
    return name.lower().startswith(RESERVED_PREFIX)
