-- SCD2 customer history: each version is valid until the next one (LEAD).
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select
    customer_id,
    segment,
    country_code,
    updated_at as valid_from,
    lead(updated_at) over (partition by customer_id order by updated_at) as valid_to,
    lead(updated_at) over (partition by customer_id order by updated_at) is null as is_current
from {{ ref('brz_customers') }}
