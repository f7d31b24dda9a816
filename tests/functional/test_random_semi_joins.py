"""Property: models with EXISTS, NOT EXISTS, IN, NOT IN and LEFT SEMI/ANTI JOIN equal their query.

The same random sequences as test_random_joins.py (every source may change
in one refresh, NULL keys, duplicates, partners that repeat), over models
whose rows must appear exactly when their first partner arrives and vanish
when their last one goes, and whose NOT IN must follow Spark's NULL rules
(the oracle is Spark running the model's own query).
"""

from __future__ import annotations

import pytest

from tests.functional.ivm_project import SEMI_JOIN_QUERIES
from tests.functional.test_random_joins import RandomJoinChanges


class TestRandomSemiJoinChanges(RandomJoinChanges):
    # In the extended command only (CONTRIBUTING.md, "Suite time"): tests/rules runs
    # these models' delta rules over many more sequences in the README's command.
    pytestmark = pytest.mark.extended

    queries = SEMI_JOIN_QUERIES
