"""The Spark runtimes the plugin brings: the embedded one, a Thrift server and a local cluster.

embedded.py holds the Spark configs of the embedded runtime (Delta Lake, a local
master, warehouse and metastore under the runtime directory) and fetches the
Delta jars; sessions.py gives each embedded connection a Spark session of its
own; server.py starts a local Spark Thrift Server with those configs for
``method: thrift`` (``python -m dbt.adapters.spark_ivm.runtime.server``); and
cluster.py a local standalone master and workers with that server as their
driver (``python -m dbt.adapters.spark_ivm.runtime.cluster``). Nothing here reads
or writes an ivm model: the refresh reaches Spark only through SQL on dbt's
connection.
"""
