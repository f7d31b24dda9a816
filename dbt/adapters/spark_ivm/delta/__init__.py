"""Delta Lake through SQL, so that both connection modes work: what a table says, what a conf is.

history.py reads a table's commits (DESCRIBE HISTORY: CommitRows, the commit
metadata JSON); tables.py what a table is (SHOW TBLPROPERTIES, DESCRIBE
DETAIL) and SourceSnapshot, a source as a refresh pins it; records.py the
record a refresh's commit carries (commit_metadata) and the state it reads
back (RecordedState); confs.py the session confs the plugin sets (a commit's
metadata, the version it made, those a change runs under: Staging); errors.py
what a Spark or Delta error means to a refresh. The statements are commands
sqlglot does not model, built as text with identifiers rendered quoted by
sqlglot (TableName.sql()), never pasted from user input.
"""
