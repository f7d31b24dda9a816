-- A CTE (merged into the query) joined to a dimension, deduplicated.
with paid as (
    select customer_id, unit_price from {{ source('shop', 'order_lines') }} where status = 'paid'
)
select distinct c.customer_id, c.name, c.segment
from paid p
join {{ source('shop', 'customers') }} c on p.customer_id = c.customer_id
where p.unit_price > 10
