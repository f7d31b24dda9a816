-- Aggregates without GROUP BY: always exactly one row, even for an empty source.
select
    count(*) as lines,
    sum(quantity) as units,
    avg(quantity * unit_price) as avg_amount
from {{ source('shop', 'order_lines') }}
where status <> 'cancelled'
