"""One refresh of one ivm model: the recipe and each of its steps, a module each.

recipe.py holds `Refresh`, the recipe impl.py runs for `ivm_refresh`: the
no-change shortcut (unchanged.py), compile, pin the sources (pins.py), read
what the state recorded (state_history.py, upstreams.py for the views it
reads), decide (decision.py, pure; strategy.py's estimate, schema_changes.py's
source columns), write (writes.py, with join_states.py's upkeep) and publish
(consistency/publish.py). They reach Spark only through the `Runner` they are
given (SQL on dbt's connection), reading Delta's metadata with delta/.
"""
