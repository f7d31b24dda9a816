"""The one error type of the compiler: a model that cannot be maintained incrementally."""

from __future__ import annotations

FALLBACK_HINT = (
    "materialize the model as 'table', or keep 'ivm' with "
    "ivm_fallback='full_refresh' to recompute it on every run"
)


def first_line(error: BaseException, limit: int | None = None) -> str:
    """An error's first line (or its type's name), for quoting it inside another message."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


class NotMaintainable(Exception):
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


class InvalidSource(Exception):
    """A source of an ivm model cannot be read incrementally (not Delta, no change feed...)."""

    def __init__(self, model: str, source: str, problem: str, fix: str) -> None:
        self.model = model
        self.source = source
        super().__init__(f"Model '{model}': source {source} {problem}. Fix: {fix}")
