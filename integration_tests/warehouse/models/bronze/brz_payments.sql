-- Typed payments with the payment's calendar date.
select
    payment_id,
    order_id,
    lower(method) as method,
    amount,
    cast(paid_at as date) as paid_date,
    is_refund
from {{ source('raw', 'payments') }}
