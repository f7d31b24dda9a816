"""The docstring examples of the compiler (and of the golden-fixture helpers) run as tests.

Run here rather than through --doctest-modules so the project's pytest options
stay as they are and the unit layer picks them up on its own.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import dbt.adapters.spark_ivm as adapter
import ivm_compiler

MODULES = sorted(
    {"ivm_compiler", "tests.unit.golden", "tests.unit.test_windows_golden"}
    | {info.name for info in pkgutil.walk_packages(ivm_compiler.__path__, prefix="ivm_compiler.")}
    | {info.name for info in pkgutil.walk_packages(adapter.__path__, prefix=f"{adapter.__name__}.")}
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests failed in {name}"


def test_the_rules_have_doctests() -> None:
    """Guards the test above against passing because the examples were deleted."""
    attempted = {
        name: doctest.testmod(importlib.import_module(name), verbose=False, report=False).attempted
        for name in (
            "ivm_compiler.rules.counting",
            "ivm_compiler.rules.aggregates",
            "ivm_compiler.view_classes.window",
        )
    }
    assert all(count > 0 for count in attempted.values()), attempted
