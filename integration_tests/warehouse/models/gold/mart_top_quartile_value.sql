-- What the top quartile of every segment is worth, against all customers
-- (the third level below the refused model): a global aggregate.
select
    count(*) as segments,
    sum(customers) as top_customers,
    sum(quartile_value) as top_value,
    sum(segment_value) as total_value
from {{ ref('mart_quartile_shares') }}
where spend_quartile = 1
