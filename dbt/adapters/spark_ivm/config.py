"""The ivm materialization's model configs, validated before any SQL runs."""

from __future__ import annotations

import difflib
import string
from collections.abc import Mapping
from typing import Any

from dbt_common.exceptions import CompilationError

from dbt.adapters.spark_ivm.consistency.groups import NO_GROUP
from dbt.adapters.spark_ivm.refresh.join_states import SETTINGS as JOIN_STATE_SETTINGS
from dbt.adapters.spark_ivm.refresh.schema_changes import ON_SCHEMA_CHANGE_VALUES
from dbt.adapters.spark_ivm.refresh.strategy import STRATEGIES
from dbt.adapters.spark_ivm.settings import ALL_EXTREME_VALUES, Fallback, StateForm
from ivm_compiler.rules.extremes import KEPT_VALUES

FALLBACK_VALUES = tuple(Fallback)

# config name -> what it accepts (documented in docs/configuration.md).
IVM_CONFIGS: dict[str, str] = {
    "ivm_extreme_values": f"a whole number of at least 1, {ALL_EXTREME_VALUES!r}, or unset "
    f"({KEPT_VALUES})",
    "ivm_fallback": "one of: " + ", ".join(repr(v.value) for v in FALLBACK_VALUES) + ", or unset",
    "ivm_group": f"a group name (letters, digits, _ and -), {NO_GROUP!r}, or unset",
    "ivm_join_state": "one of: "
    + ", ".join(repr(v.value) for v in JOIN_STATE_SETTINGS)
    + ", a list of the model's table aliases, or unset (none)",
    "ivm_state_form": "one of: "
    + ", ".join(repr(v.value) for v in StateForm)
    + ", or unset (auto)",
    "ivm_strategy": "one of: " + ", ".join(repr(v.value) for v in STRATEGIES) + ", or unset (auto)",
    "ivm_window_order_unique": "true or false (unset: false)",
}


def validate_model_config(model: str, config: Mapping[str, Any]) -> None:
    """Refuse unknown `ivm_*` configs and bad values, naming the model and the fix."""
    # Long but flat: one guard and its message per config, in one place so
    # every message reads alike.
    for key in config:
        if key.startswith("ivm_") and key not in IVM_CONFIGS:
            close = [known for known in IVM_CONFIGS if _similar(key, known)]
            suggestion = f"did you mean {close[0]!r}? " if close else ""
            raise CompilationError(
                f"Model '{model}': unknown config {key!r}. {suggestion}"
                f"Known ivm configs: {', '.join(sorted(IVM_CONFIGS))}."
            )
    fallback = config.get("ivm_fallback")
    if fallback is not None and fallback not in FALLBACK_VALUES:
        raise CompilationError(
            f"Model '{model}': ivm_fallback={fallback!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_fallback']}."
        )
    group = config.get("ivm_group")
    if group is not None and not (
        isinstance(group, str) and group and all(c.isalnum() or c in "_-" for c in group)
    ):
        raise CompilationError(
            f"Model '{model}': ivm_group={group!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_group']}."
        )

    chosen = config.get("ivm_strategy")
    if chosen is not None and chosen not in STRATEGIES:
        raise CompilationError(
            f"Model '{model}': ivm_strategy={chosen!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_strategy']}."
        )

    state_form = config.get("ivm_state_form")
    if state_form is not None and state_form not in tuple(StateForm):
        raise CompilationError(
            f"Model '{model}': ivm_state_form={state_form!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_state_form']}."
        )

    join_state = config.get("ivm_join_state")
    if join_state is not None and not (
        join_state in JOIN_STATE_SETTINGS
        or (
            isinstance(join_state, list)
            and join_state
            and all(isinstance(a, str) and a for a in join_state)
        )
    ):
        raise CompilationError(
            f"Model '{model}': ivm_join_state={join_state!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_join_state']}."
        )

    on_schema_change = config.get("on_schema_change")
    if on_schema_change is not None and on_schema_change not in ON_SCHEMA_CHANGE_VALUES:
        raise CompilationError(
            f"Model '{model}': on_schema_change={on_schema_change!r} is not valid; it must "
            "be one of: " + ", ".join(repr(v) for v in ON_SCHEMA_CHANGE_VALUES) + "."
        )

    extreme_values = config.get("ivm_extreme_values")
    if extreme_values is not None and not (
        extreme_values == ALL_EXTREME_VALUES
        or (type(extreme_values) is int and extreme_values >= 1)
    ):
        raise CompilationError(
            f"Model '{model}': ivm_extreme_values={extreme_values!r} is not valid; it must be "
            f"{IVM_CONFIGS['ivm_extreme_values']}: how many of a group's smallest (MIN) or "
            "largest (MAX) values the state keeps."
        )

    unique_order = config.get("ivm_window_order_unique")
    if unique_order is not None and not isinstance(unique_order, bool):
        raise CompilationError(
            f"Model '{model}': ivm_window_order_unique={unique_order!r} is not valid; it "
            f"must be {IVM_CONFIGS['ivm_window_order_unique']} (a YAML or Jinja boolean, "
            "not a string)."
        )


# Spark's session catalog takes table and schema names of these characters
# only (INVALID_SCHEMA_OR_RELATION_NAME otherwise, quoted or not), and
# dbt-spark writes relation names into its SQL unquoted by default and never
# escapes a backtick: anything else in a name is refused before SQL runs.
NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_")


def validate_relation_name(model: str, kind: str, name: str | None) -> None:
    """Refuse a schema or relation name Spark cannot store and dbt-spark would paste raw.

    >>> validate_relation_name("model.p.m", "alias", "Daily_Totals_2")
    >>> validate_relation_name("model.p.m", "alias", "x`; drop table t")
    Traceback (most recent call last):
    ...
    dbt_common.exceptions.base.CompilationError: Compilation Error
      Model 'model.p.m': alias 'x`; drop table t' is not a valid name ...
    """
    if name is None or (name and set(name) <= NAME_CHARACTERS):
        return
    raise CompilationError(
        f"Model '{model}': {kind} {name!r} is not a valid name for Spark (its catalog "
        "takes only letters, digits and _ in table and schema names, and dbt-spark "
        f"writes names into SQL unquoted). Fix: set the {kind} config to a name of "
        "letters, digits and _."
    )


def validate_schema_name(schema: str | None) -> None:
    """Refuse a schema name before dbt-spark's `create schema if not exists <name>` runs."""
    if schema is None or (schema and set(schema) <= NAME_CHARACTERS):
        return
    raise CompilationError(
        f"schema {schema!r} is not a valid name for Spark (its catalog takes only letters, "
        "digits and _ in schema names, and dbt-spark writes names into SQL unquoted). "
        "Fix: set the models' schema config (or the profile's schema) to a name of "
        "letters, digits and _."
    )


def _similar(a: str, b: str) -> bool:
    return difflib.SequenceMatcher(None, a, b).ratio() >= 0.75
