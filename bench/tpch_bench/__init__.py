"""The TPC-H refresh benchmark of dbt-spark-ivm (issue 5): `ivm` refreshes against `table` rebuilds.

Run it with `bench/run` (see bench/README.md). One module per concern:

- ``settings``: what a run covers (scale factors, change batches, repetitions) and where
  its files go;
- ``catalog``: the benchmarked models, each defined as a `table` and as an `ivm` model;
- ``generate``: TPC-H parquet from tpchgen-cli, the base tables and 1,000 refresh parts;
- ``load``: the parquet loaded into Delta tables with the change data feed on;
- ``batches``: the change batches (TPC-H RF1/RF2 and the updates TPC-H lacks);
- ``spark_session``: the one SparkSession of the process, its start time, job and input metrics;
- ``dbt_driver``: dbt driven in-process through dbtRunner with one parsed manifest;
- ``verify``: the correctness guard (ivm model equals table model, as bags);
- ``measure``: the experiment itself, interleaved and repeated;
- ``report``: results JSON into a markdown table and PNG plots.
"""
