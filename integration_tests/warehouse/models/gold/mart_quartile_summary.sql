-- Customers and value per segment and spend quartile, over the refused model
-- (its first level of ivm readers): an aggregate with MIN.
select
    segment,
    spend_quartile,
    count(*) as customers,
    sum(lifetime_value) as quartile_value,
    min(lifetime_value) as quartile_floor
from {{ ref('mart_customer_spend_quartiles') }}
group by segment, spend_quartile
