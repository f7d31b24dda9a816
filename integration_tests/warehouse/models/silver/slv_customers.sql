-- The current version of each customer: the latest-row-per-key dedupe idiom
-- (a ROW_NUMBER plan node, filtered to rank 1).
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select customer_id, full_name, email, country_code, segment, updated_at
from (
    select
        customer_id, full_name, email, country_code, segment, updated_at,
        row_number() over (partition by customer_id order by updated_at desc) as version_rank
    from {{ ref('brz_customers') }}
) as ranked
where version_rank = 1
