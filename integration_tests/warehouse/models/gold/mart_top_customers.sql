-- The ten most valuable customers (top-k: the state keeps every customer).
select customer_id, lifetime_value
from {{ ref('mart_customer_ltv') }}
order by lifetime_value desc, customer_id
limit 10
