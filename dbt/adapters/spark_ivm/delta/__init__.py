"""Delta Lake through SQL: what the plugin reads of Delta tables and the session confs it sets.

Every statement here is a Delta or Spark command that sqlglot does not model
(DESCRIBE HISTORY/DETAIL, SHOW TBLPROPERTIES, SET and RESET of a session conf),
built as text with identifiers rendered quoted by sqlglot, never pasted from
user input, so that both connection modes (an embedded session and a Thrift
server) run them alike.
"""
