-- Settled payments of known orders (a correlated EXISTS: a semi join).
select p.payment_id, p.order_id, p.method, p.amount, p.paid_date
from {{ ref('brz_payments') }} p
where not p.is_refund
    and exists (select 1 from {{ ref('brz_orders') }} o where o.order_id = p.order_id)
