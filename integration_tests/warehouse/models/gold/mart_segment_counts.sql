-- Current customers per segment, read off the SCD2 history.
select segment, count(*) as customers
from {{ ref('slv_customer_history') }}
where is_current
group by segment
