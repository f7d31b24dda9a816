"""The plugin's errors: one base (IvmError), the compiler's refusals and unreadable sources."""

from __future__ import annotations

FALLBACK_HINT = (
    "materialize the model as 'table', or keep 'ivm' with "
    "ivm_fallback='full_refresh' to recompute it on every run"
)


def first_line(error: BaseException, limit: int | None = None) -> str:
    """An error's first line (or its type's name), for quoting it inside another message.

    dbt's errors start with a header line of their kind ("Runtime Error",
    "Database Error"): the line after it says what went wrong (over Thrift,
    a Spark error reaches the plugin only in that form).

    >>> first_line(RuntimeError("Runtime Error\\n  [DELTA_X] it failed\\n  at ..."))
    '[DELTA_X] it failed'
    >>> first_line(ValueError("one line"))
    'one line'
    """
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    header = lines[0].split()
    if len(lines) > 1 and len(header) == 2 and header[1] == "Error":
        lines = lines[1:]
    return lines[0][:limit]


class IvmError(Exception):
    """The base of every error the plugin raises about a model.

    Each names the model (`model`), what is wrong and the fix, in its message.
    The refresh's own (writes.ConcurrentRefresh, schema_changes.ModelColumnsChanged)
    derive from it too.
    """

    model: str


class NotMaintainable(IvmError):
    """The model's SQL uses something the ivm materialization cannot maintain.

    The message always names the model, the construct and a fix, in the style
    of pg_ivm: "<construct> is not supported ...", then a hint.
    """

    def __init__(self, model: str, construct: str, hint: str = FALLBACK_HINT) -> None:
        self.model = model
        self.construct = construct
        self.hint = hint
        super().__init__(
            f"Model '{model}' cannot be maintained incrementally: {construct} "
            f"is not supported by the ivm materialization. Fix: {hint}."
        )


class InvalidSource(IvmError):
    """A source of an ivm model cannot be read incrementally (not Delta, no change feed...)."""

    def __init__(self, model: str, source: str, problem: str, fix: str) -> None:
        self.model = model
        self.source = source
        super().__init__(f"Model '{model}': source {source} {problem}. Fix: {fix}")


class StateFormRefused(IvmError):
    """ivm_state_form='log' asked of a model whose state cannot be a log (log_state.py)."""

    def __init__(self, model: str, reason: str) -> None:
        self.model = model
        super().__init__(
            f"Model '{model}': ivm_state_form='log' cannot keep this model's state: {reason}. "
            "Fix: remove ivm_state_form (or set it to 'merged'); see docs/configuration.md."
        )
