-- Semi and anti joins: customers with an open line and no paid one. The NOT IN
-- subquery leaves out lines without a customer: one NULL there would make
-- NOT IN hide every customer (Spark's NULL rules, which the model keeps).
select c.customer_id, c.name, c.segment
from {{ source('shop', 'customers') }} c
where exists (
    select 1 from {{ source('shop', 'order_lines') }} o
    where o.customer_id = c.customer_id and o.status = 'open'
)
and c.customer_id not in (
    select customer_id from {{ source('shop', 'order_lines') }}
    where status = 'paid' and customer_id is not null
)
