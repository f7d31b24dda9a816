"""Delta rules, one module per operator family; the view classes (view_classes/) use them.

Each rule says, for one kind of state column or join, how it is computed
from source rows (first build) and from signed change rows (refresh), and
how the model's value is read back from it.
"""
