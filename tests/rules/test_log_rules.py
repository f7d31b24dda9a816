"""Property: a state kept as a log (log_state.py) consolidates to the rebuild and the query.

For every model whose state can be a log (ivm_state_form 'log', or 'auto',
the default), the random scenarios of test_delta_rules.py, with the change
taken by the compiler's INSERT of the change rows (every other refresh by
its rewrite, log_state.compact): after each refresh the log's consolidated
rows (what the view reads) equal the build at the new versions, the view
equals the model's query, and a rewritten log holds one row per key
(oracle.Refreshes._check_log). A module of its own, so xdist can run it
beside the merged form's.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm_compiler import log_state
from tests.rules.models import MODELS, Model
from tests.rules.oracle import Mismatch, chain_of, compiled, run
from tests.rules.test_delta_rules import (
    MODEL_BY_NAME,
    RULES_SETTINGS,
    _flip_first_insert,
    _scenario,
    scenarios,
)

# The models whose state can be a log: not those with plan nodes, which the
# refresh keeps merged (log_state.Circumstances.plan_nodes).
LOG_MODELS = [
    model
    for model in MODELS
    if log_state.refusal(
        compiled(model), log_state.Circumstances(plan_nodes=bool(chain_of(model).nodes))
    )
    is None
]


def test_the_log_models_are_the_additive_ones():
    """Projections, DISTINCT, UNION ALL and integer/decimal aggregates; MIN/MAX stay merged."""
    names = {model.name for model in LOG_MODELS}
    assert {"grouped", "distinct_pairs", "stacked", "joined_rows", "global"} <= names
    assert "joined_groups" not in names  # MIN/MAX and COUNT(DISTINCT)


@pytest.mark.parametrize("model", [pytest.param(m, id=m.name) for m in LOG_MODELS])
@RULES_SETTINGS
@given(data=st.data())
def test_log_states_consolidate_to_rebuilds_and_the_query(model: Model, data: st.DataObject):
    run(model, data.draw(scenarios(model), label="scenario"), log=True)


@pytest.mark.parametrize("name", ["grouped", "joined_rows"])
def test_a_log_with_a_flipped_sign_is_caught(name: str) -> None:
    model = MODEL_BY_NAME[name]
    run(model, _scenario(model), log=True)
    with pytest.raises(Mismatch, match="consolidated log differs from the build"):
        run(model, _scenario(model), hook=_flip_first_insert, log=True)
