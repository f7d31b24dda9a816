"""The ivm compiler: a model's SQL -> maintenance plan -> Spark SQL delta statements.

Pure Python over sqlglot; it never talks to Spark. Facts it needs from the
catalog (source columns, output types) come through the Catalog protocol.
"""

from ivm_compiler.compile import STATE_FORMAT_VERSION, Catalog, compile_model
from ivm_compiler.errors import InvalidSource, IvmError, NotMaintainable
from ivm_compiler.parse import parse_model
from ivm_compiler.plan import ViewClass, ViewPlan
from ivm_compiler.sql import TableName

__all__ = [
    "STATE_FORMAT_VERSION",
    "Catalog",
    "InvalidSource",
    "IvmError",
    "NotMaintainable",
    "TableName",
    "ViewClass",
    "ViewPlan",
    "compile_model",
    "parse_model",
]
