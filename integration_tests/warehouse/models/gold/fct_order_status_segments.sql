-- Each order status change with the segment and country its customer had at
-- that moment: a point-in-time LEFT JOIN to the SCD2 customer history on its
-- validity range (valid_from <= ts < valid_to, the current version's valid_to
-- NULL). Guest checkouts, erased customers and changes before the customer's
-- first version keep NULLs.
select
    o.order_id,
    o.status,
    o.updated_at as changed_at,
    o.customer_id,
    h.segment,
    h.country_code
from {{ ref('brz_orders') }} o
left join {{ ref('slv_customer_history') }} h
    on o.customer_id = h.customer_id
    and h.valid_from <= o.updated_at
    and (h.valid_to is null or o.updated_at < h.valid_to)
