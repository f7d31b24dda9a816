-- Each order with the region its customer was in when it was placed: a fact
-- joined to an SCD2 dimension on its validity range (valid_from <= ts < valid_to).
select
    o.order_id,
    o.customer_id,
    o.order_date,
    h.region,
    h.segment
from {{ ref('slv_orders') }} o
join {{ ref('slv_customer_region_history') }} h
    on o.customer_id = h.customer_id
    and h.valid_from <= o.order_date
    and (h.valid_to is null or o.order_date < h.valid_to)
