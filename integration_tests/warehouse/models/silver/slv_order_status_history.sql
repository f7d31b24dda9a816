-- SCD2 order status history: each status holds until the next change.
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select
    order_id,
    status,
    updated_at as valid_from,
    lead(updated_at) over (partition by order_id order by updated_at) as valid_to
from {{ ref('brz_orders') }}
