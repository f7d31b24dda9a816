-- Settled payments with the paying customer.
select p.payment_id, p.order_id, o.customer_id, p.method, p.amount, p.paid_date
from {{ ref('slv_payments') }} p
join {{ ref('slv_orders') }} o on p.order_id = o.order_id
