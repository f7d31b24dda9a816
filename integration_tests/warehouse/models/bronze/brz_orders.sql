-- Order status changes with the order's calendar date split out.
select
    order_id,
    customer_id,
    lower(status) as status,
    cast(order_ts as date) as order_date,
    updated_at
from {{ source('raw', 'orders') }}
where order_id is not null
