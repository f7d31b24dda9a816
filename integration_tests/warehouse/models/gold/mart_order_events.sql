-- An event stream: every order and every payment (UNION ALL).
select order_id, 'ordered' as event, order_date as event_date from {{ ref('fct_orders') }}
union all
select order_id, 'paid' as event, paid_date as event_date from {{ ref('fct_payments') }}
