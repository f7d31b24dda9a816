from dbt.adapters.base import AdapterPlugin

from dbt.adapters.spark_ivm.connections import (
    SparkIvmConnectionManager,  # noqa: F401
    SparkIvmCredentials,
)
from dbt.adapters.spark_ivm.impl import SparkIvmAdapter
from dbt.include import spark_ivm

Plugin = AdapterPlugin(
    adapter=SparkIvmAdapter,  # type: ignore[arg-type]
    credentials=SparkIvmCredentials,
    include_path=spark_ivm.PACKAGE_PATH,
    dependencies=["spark"],
)
