-- How order-line amounts spread per category: STDDEV and VARIANCE kept as
-- counts, means and squared deviations (docs/supported-sql.md).
select
    category,
    count(*) as lines,
    avg(net_amount) as mean_amount,
    stddev(net_amount) as amount_stddev,
    var_pop(quantity) as quantity_variance
from {{ ref('fct_order_lines') }}
group by category
