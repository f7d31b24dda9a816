-- SCD2 history of each customer's region, built from a join (customer
-- versions and the country reference): the windows read the join through a
-- plan node of its own (docs/supported-sql.md, "Windows over joins").
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select
    c.customer_id,
    c.segment,
    n.region,
    c.updated_at as valid_from,
    lead(c.updated_at) over (partition by c.customer_id order by c.updated_at) as valid_to
from {{ ref('brz_customers') }} c
join {{ ref('brz_countries') }} n on c.country_code = n.country_code
