"""Property: models with EXISTS, NOT EXISTS, IN, NOT IN and LEFT SEMI/ANTI JOIN equal their query.

The same random sequences as test_random_joins.py (every source may change
in one refresh, NULL keys, duplicates, partners that repeat), over models
whose rows must appear exactly when their first partner arrives and vanish
when their last one goes, and whose NOT IN must follow Spark's NULL rules
(the oracle is Spark running the model's own query).
"""

from __future__ import annotations

import pytest

from tests.functional.ivm_checks import node_models
from tests.functional.ivm_project import SEMI_JOIN_QUERIES, SUBQUERY_NODE_QUERIES
from tests.functional.test_random_joins import RandomJoinChanges


class TestRandomSemiJoinChanges(RandomJoinChanges):
    # In the extended command only (CONTRIBUTING.md, "Suite time"): tests/rules runs
    # these models' delta rules over many more sequences in the README's command.
    pytestmark = pytest.mark.extended

    queries = SEMI_JOIN_QUERIES


class TestRandomSubqueryNodeChanges(RandomJoinChanges):
    """EXISTS, NOT EXISTS, IN and NOT IN over joins, CTEs, derived tables and aggregates.

    Each such subquery is kept as a plan node (subquery_inputs.py) whose
    distinct keys' change drives the semi or anti join; neither the model nor
    its nodes are ever rebuilt (assert_built_once).
    """

    # In the extended command only, as the other semi join classes: tests/rules
    # runs these models, their nodes refreshed first, in the README's command.
    pytestmark = pytest.mark.extended

    queries = SUBQUERY_NODE_QUERIES

    def test_every_subquery_that_is_not_one_tables_rows_is_a_plan_node(
        self, project, spark, sources
    ):
        found = {model: node_models(spark, project.test_schema, model) for model in self.queries}
        assert found == {
            model: [f"{model}__ivm_cte_{'tops' if model == 'in_cte_aggregate' else 'subquery'}"]
            for model in self.queries
        }
