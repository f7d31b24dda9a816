-- A CTE (merged into the query) joined to a dimension, deduplicated. Both join
-- inputs keep a join state (a reverse-join table: paid lines over 10, and the
-- customers' three columns), read in place of the sources when the other side
-- changes.
{{ config(ivm_join_state='all') }}
with paid as (
    select customer_id, unit_price from {{ source('shop', 'order_lines') }} where status = 'paid'
)
select distinct c.customer_id, c.name, c.segment
from paid p
join {{ source('shop', 'customers') }} c on p.customer_id = c.customer_id
where p.unit_price > 10
