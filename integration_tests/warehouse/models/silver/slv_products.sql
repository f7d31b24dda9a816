-- The current version of each product (latest-row-per-key dedupe).
-- updated_at is unique per key (raw_data.py), so the window's order has no ties.
{{ config(ivm_window_order_unique=true) }}
select product_id, product_name, category, list_price, updated_at
from (
    select
        product_id, product_name, category, list_price, updated_at,
        row_number() over (partition by product_id order by updated_at desc) as version_rank
    from {{ ref('brz_products') }}
) as ranked
where version_rank = 1
