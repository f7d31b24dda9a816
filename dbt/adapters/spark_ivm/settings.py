"""What a model asks of its refresh: its ivm_* configs, read once into a frozen object.

The closed sets of values (the refresh's actions, ivm_strategy, ivm_join_state,
ivm_fallback) are enums here, the one place both the Python side and the
materialization's Jinja read them from (Jinja sees `RefreshResult` flags,
never the strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ivm_compiler.emit import ViewDocs
from ivm_compiler.rules.extremes import KEPT_VALUES


class _Value(str, Enum):
    """An enum whose members are their config strings (`Strategy.AUTO == 'auto'`)."""

    def __str__(self) -> str:
        return str(self.value)


class Action(_Value):
    """What a refresh did to the model; upper-cased, the adapter response's code."""

    BUILD = "build"  # first build: no state yet
    REBUILD = "rebuild"  # the state cannot be brought forward (the reason says why)
    RECOMPUTE = "recompute"  # a change that ivm_strategy found cheaper to recompute
    INCREMENTAL = "incremental"  # the change applied to the state
    NO_CHANGE = "no_change"  # nothing to apply
    FALLBACK = "fallback"  # not maintainable: the materialization builds a table


class Strategy(_Value):
    """ivm_strategy: how a change is applied (refresh/strategy.py)."""

    AUTO = "auto"
    INCREMENTAL = "incremental"
    RECOMPUTE = "recompute"


class JoinStateSetting(_Value):
    """ivm_join_state's named values (or a list of aliases; refresh/join_states.py)."""

    NONE = "none"
    AUTO = "auto"
    ALL = "all"


class StateForm(_Value):
    """ivm_state_form: how a change reaches the state (ivm_compiler/log_state.py)."""

    MERGED = "merged"  # merged into the state's rows (a guarded MERGE)
    LOG = "log"  # appended as signed rows, consolidated when read
    AUTO = "auto"  # a log where the model allows one, merged otherwise


class Fallback(_Value):
    """ivm_fallback: what to do with a model the compiler refuses."""

    FULL_REFRESH = "full_refresh"


@dataclass(frozen=True)
class RefreshSettings:
    """A model's refresh settings, validated by config.validate_model_config first."""

    full_refresh: bool = False
    fallback: Fallback | None = None
    strategy: Strategy = Strategy.AUTO
    # A JoinStateSetting, or the aliases of the inputs that keep one.
    join_state: JoinStateSetting | tuple[str, ...] = JoinStateSetting.NONE
    # The user vouches that every window's PARTITION BY and ORDER BY pick out
    # one row, so the plan's tie warnings are not logged.
    window_order_unique: bool = False
    # dbt's on_schema_change, for the model's own columns: 'fail' stops a
    # rebuild that would change them; the other values rebuild (an ivm model
    # always has its query's columns).
    on_schema_change: str = "ignore"
    # Whether ivm models read the state's changes (models that ref this one, or
    # the model a plan node belongs to): only then does it keep a change feed.
    change_feed: bool = True
    # The ivm models reading the state, as "schema.identifier" (their views'
    # refresh histories weigh how a recompute hands its change on,
    # refresh/handoff.py); empty when dbt's graph was not given.
    readers: tuple[str, ...] = ()
    # persist_docs: the view carries the model's descriptions; it is then
    # recreated on every run, so edited descriptions show up without a rebuild.
    docs: ViewDocs | None = None
    state_form: StateForm = StateForm.AUTO
    # ivm_extreme_values: how many of a group's most extreme values a MIN or
    # MAX keeps (None: all of them; ivm_compiler/rules/extremes.py).
    extreme_values: int | None = KEPT_VALUES

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        full_refresh: bool = False,
        docs: ViewDocs | None = None,
        change_feed: bool = True,
        readers: tuple[str, ...] = (),
    ) -> RefreshSettings:
        """The settings of a model's config (as dbt hands it to the materialization)."""
        fallback = config.get("ivm_fallback")
        join_state = config.get("ivm_join_state") or JoinStateSetting.NONE
        return cls(
            full_refresh=full_refresh,
            fallback=Fallback(fallback) if fallback else None,
            strategy=Strategy(config.get("ivm_strategy") or Strategy.AUTO),
            join_state=tuple(join_state)
            if isinstance(join_state, list)
            else JoinStateSetting(join_state),
            window_order_unique=bool(config.get("ivm_window_order_unique")),
            on_schema_change=config.get("on_schema_change") or "ignore",
            change_feed=change_feed,
            readers=readers,
            docs=docs,
            state_form=StateForm(config.get("ivm_state_form") or StateForm.AUTO),
            extreme_values=_extreme_values(config.get("ivm_extreme_values")),
        )


# ivm_extreme_values' value for keeping every distinct value.
ALL_EXTREME_VALUES = "all"


def _extreme_values(configured: Any) -> int | None:
    """ivm_extreme_values as the compiler takes it: a number, or None for 'all'."""
    if configured is None:
        return KEPT_VALUES
    return None if configured == ALL_EXTREME_VALUES else int(configured)
