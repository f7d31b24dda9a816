"""What a Spark or Delta error means to a refresh, told from its message.

Both connection modes see the same errors, wrapped over Thrift by dbt-spark
and the server: a change feed that is gone (rebuild at the pinned version),
another refresh that committed first (the guard's RAISE_ERROR or Delta's
concurrent-commit conflicts), a MERGE's own RAISE_ERROR (a removal that would
cancel a group's moments, bounded MIN/MAX values that ran out), and the line
of an error worth quoting in a reason.
"""

from __future__ import annotations

import re

from ivm_compiler.emit import CANCELLED, EXHAUSTED, GUARD_FAILED
from ivm_compiler.errors import first_line
from ivm_compiler.rules.top_k_buffer import SHORT

# Messages of Spark/Delta errors that mean "the change feed for that window is
# gone": the only safe answer is a full rebuild at the pinned version.
CHANGE_HISTORY_UNAVAILABLE = (
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_CHANGE_TABLE_FEED_DISABLED",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    # A window spanning a column rename, drop or type change of a column
    # mapping table (refresh/schema_changes.py finds renames and drops beforehand).
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE",
    # A vacuumed change file, as the Thrift server reports it (no Java cause chain).
    "FAILED_READ_FILE.FILE_NOT_EXIST",
    "VersionNotFoundException",
    "cannot time travel",
    "Error getting change data",
    "change data was not recorded",
    "FileNotFoundException",
    "is not available for version",
)


# A Spark or Delta error's class and message, e.g. "[DELTA_FILE_NOT_FOUND] ...".
_ERROR_CLASS_LINE = re.compile(r"\[[A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)?\][^\n]*")


def error_summary(error: BaseException, limit: int = 300) -> str:
    """The line of an error that says what Spark refused, for quoting it in a reason.

    Over Thrift a Spark error reaches the plugin wrapped by dbt-spark
    ("Database Error", the server's exception chain), so its first line says
    little; the line with the error class says what happened.

    >>> error_summary(RuntimeError("Database Error\\n  org.x.HiveSQLException: Error running "
    ...     "query: org.y.E: [DELTA_X_Y] it failed.\\n  at z"))
    '[DELTA_X_Y] it failed.'
    >>> error_summary(ValueError("no class here"))
    'no class here'
    """
    found = _ERROR_CLASS_LINE.search(str(error))
    return found.group(0).strip()[:limit] if found else first_line(error, limit=limit)


# How Spark's RAISE_ERROR starts the error it raises: with its error class
# from Spark 4.0; Spark 3.5 raises a plain RuntimeException with the message
# (measured on 3.5.9: "java.lang.RuntimeException: ivm guard: ...", in the
# Java cause chain both modes see).
RAISED = "[USER_RAISED_EXCEPTION]"
RAISED_BY_SPARK_3 = "java.lang.RuntimeException:"
RAISED_FORMS = (RAISED, RAISED_BY_SPARK_3)


def _raised(error: BaseException, message: str) -> bool:
    """Whether `error` is RAISE_ERROR's with a message starting `message`, on any supported Spark.

    >>> _raised(Exception("... Caused by: java.lang.RuntimeException: ivm guard: a.b"), "ivm guard:")
    True
    >>> _raised(Exception("[USER_RAISED_EXCEPTION] ivm guard: a.b SQLSTATE: P0001"), "ivm guard:")
    True
    >>> _raised(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm guard: a')"), "ivm guard:")
    False
    """
    text = str(error)
    return any(f"{form} {message}" in text for form in RAISED_FORMS)


def is_cancelling_removal(error: BaseException) -> bool:
    """Whether a state MERGE refused a removal that would cancel a group's moments.

    Only as the message RAISE_ERROR raised: a statement's other errors (a
    syntax error, say) may quote its SQL, which holds the message too.

    >>> is_cancelling_removal(Exception("[USER_RAISED_EXCEPTION] ivm cancelled: taking ..."))
    True
    >>> is_cancelling_removal(Exception("[USER_RAISED_EXCEPTION] ivm guard: a.m__ivm_state"))
    False
    >>> is_cancelling_removal(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm cancelled: ...')"))
    False
    """
    return _raised(error, CANCELLED)


def is_exhausted(error: BaseException) -> bool:
    """Whether a state MERGE stopped at a group whose bounded MIN/MAX values ran out.

    >>> is_exhausted(Exception("[USER_RAISED_EXCEPTION] ivm exhausted: a group of ..."))
    True
    >>> is_exhausted(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm exhausted: ...')"))
    False
    """
    return _raised(error, EXHAUSTED)


def is_top_k_short(error: BaseException) -> bool:
    """Whether a state MERGE refused a change that may leave a top-k state fewer than k rows.

    >>> is_top_k_short(Exception("[USER_RAISED_EXCEPTION] ivm top-k short: the change ..."))
    True
    """
    return _raised(error, SHORT)


def is_change_history_unavailable(error: BaseException) -> bool:
    text = str(error)
    return any(marker.lower() in text.lower() for marker in CHANGE_HISTORY_UNAVAILABLE)


# Errors of a MERGE into a state that mean another refresh of the same model
# committed first: its guard check failed (emit.GUARD_FAILED), or Delta found
# a concurrent commit to the files it read (DeltaConcurrentModificationException
# and its subclasses, by class name and by error class).
CONCURRENT_REFRESH = (
    *(f"{form} {GUARD_FAILED}:" for form in RAISED_FORMS),
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def is_concurrent_refresh(error: BaseException) -> bool:
    """Whether a state MERGE failed because another refresh committed to the state first.

    >>> is_concurrent_refresh(Exception("[USER_RAISED_EXCEPTION] ivm guard: a.m__ivm_state ..."))
    True
    >>> is_concurrent_refresh(Exception("io.delta.exceptions.ConcurrentAppendException: Files"))
    True
    >>> is_concurrent_refresh(Exception("[DIVIDE_BY_ZERO] Division by zero"))
    False
    >>> is_concurrent_refresh(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm guard: a')"))
    False
    """
    text = str(error)
    return any(marker in text for marker in CONCURRENT_REFRESH)
