"""Consistency groups: ivm models that share sources refresh from one snapshot and publish together.

groups.py forms the groups from dbt's graph and selection (connected by shared
inputs, or named by `ivm_group`) and holds one invocation's progress through
them; publish.py points a model's view at its new state version, alone or,
for a group, after its last member behind one row of the commit log, and
repairs commits whose views did not all move; strict.py serves strict reads
(the `ivm_committed` macro), every member read at one committed group state.
publish.py also declares the `Runner` and `Log` protocols the refresh's
steps talk to Spark and to dbt's log through.
"""
