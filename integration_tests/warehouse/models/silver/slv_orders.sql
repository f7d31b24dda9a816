-- The current status of each order (latest-row-per-key dedupe).
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select order_id, customer_id, status, order_date, updated_at
from (
    select
        order_id, customer_id, status, order_date, updated_at,
        row_number() over (partition by order_id order by updated_at desc) as version_rank
    from {{ ref('brz_orders') }}
) as ranked
where version_rank = 1
