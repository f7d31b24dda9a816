-- Order lines with a non-NULL discount; lines with no quantity are dropped.
select
    order_id,
    line_no,
    product_id,
    quantity,
    unit_price,
    coalesce(discount, 0) as discount
from {{ source('raw', 'order_items') }}
where quantity > 0
