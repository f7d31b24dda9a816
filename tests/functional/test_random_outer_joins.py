"""Property: models with LEFT, RIGHT and FULL joins equal their query after any change sequence.

The same random sequences as test_random_joins.py (every source may change
in one refresh, NULL keys, duplicates, partners that repeat), over models
whose NULL-padded rows must appear exactly when a key loses its last
partner and vanish when it gains its first, on either side and through
chains of joins.
"""

from __future__ import annotations

import pytest

from tests.functional.ivm_project import OUTER_JOIN_QUERIES
from tests.functional.test_random_joins import RandomJoinChanges


class TestRandomOuterJoinChanges(RandomJoinChanges):
    # In the extended command only (CONTRIBUTING.md, "Suite time"): tests/rules runs
    # these models' delta rules over many more sequences in the README's command.
    pytestmark = pytest.mark.extended

    queries = OUTER_JOIN_QUERIES
