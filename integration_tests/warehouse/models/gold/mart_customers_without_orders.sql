-- Current customers who never ordered (NOT EXISTS: an anti join).
select c.customer_id, c.full_name, c.segment
from {{ ref('dim_customers') }} c
where not exists (select 1 from {{ ref('fct_orders') }} o where o.customer_id = c.customer_id)
