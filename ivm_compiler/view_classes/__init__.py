"""View classes, one module per class: which queries it maintains, its state, its change, its view.

Each module implements protocol.ViewClassRule; compile.VIEW_CLASSES tries
them in order on the qualified query, the way sqlglot's optimizer runs its
RULES, and emit.py reaches a plan's rules through compile.view_class_rule.
The operator families they are built from (counting, aggregates, extremes,
outer and semi joins) are in rules/. top_k.py is a modifier of any class:
its state is the class's, its view the class's view ordered and limited.

This file imports nothing, so importing one view class does not import the
others (tests/unit/test_import_graph.py).
"""
