-- The ten most valuable customers (top-k over a projection: the state keeps
-- the best 10,000 customers, not all of them; ivm_compiler/rules/top_k_buffer.py).
select customer_id, lifetime_value
from {{ ref('mart_customer_ltv') }}
order by lifetime_value desc, customer_id
limit 10
