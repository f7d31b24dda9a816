-- An ivm model over an ivm model: it reads revenue_by_segment's state changes.
select
    count(*) as segments,
    max(revenue) as best_revenue,
    sum(lines) as lines,
    max(highest_price) as highest_price
from {{ ref('revenue_by_segment') }}
having count(*) > 0
