-- The customer dimension: current customers with their country and region
-- (a LEFT JOIN: customers of an unknown country keep NULLs).
select
    c.customer_id,
    c.full_name,
    c.email,
    c.segment,
    c.country_code,
    n.country_name,
    n.region
from {{ ref('slv_customers') }} c
left join {{ ref('brz_countries') }} n on c.country_code = n.country_code
