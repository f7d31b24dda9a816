"""The small state the write-form scripts share: its rows, a three-row change, the guarded MERGE.

The MERGE has the clauses `emit.merge_changes` gives a guarded refresh (a
guard source row, DELETE, UPDATE, INSERT and the stale-guard clause); the
change updates one group, empties another and adds one. The statements take
named parameters: `:n` state rows, `:r` the guard read, `:w` the one written.
"""

CHANGE_VIEW = """create or replace temp view chg as select * from values
  (1, 1L, cast(5 as decimal(20,2))), (2, -3L, cast(-4 as decimal(20,2))), (-7, 1L, cast(7 as decimal(20,2)))
  as t(k, cnt, total)"""

CREATE_STATE = """create table s.state using delta as
  select k, cnt, total, cast(null as string) as g
  from (select id as k, 3L as cnt, cast(id*2 as decimal(20,2)) as total from range(:n))
  union all select null, null, null, 'g0'"""

GUARDED_MERGE = """merge into s.state t
  using (select c.*, gc.g from chg c full outer join (select :r as g) gc on false) s
  on t.k <=> s.k and t.g <=> s.g
  when matched and s.g is not null then update set t.g = :w
  when matched and t.cnt + s.cnt = 0 then delete
  when matched then update set t.cnt = t.cnt + s.cnt, t.total = t.total + s.total
  when not matched and s.g is null then insert (k, cnt, total, g) values (s.k, s.cnt, s.total, null)
  when not matched and s.g is not null then insert (g) values (raise_error('guard'))"""
