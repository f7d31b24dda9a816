-- Price history: every product version with the price it replaced (LAG).
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select
    product_id,
    list_price,
    lag(list_price) over (partition by product_id order by updated_at) as previous_price,
    updated_at as changed_at
from {{ ref('brz_products') }}
