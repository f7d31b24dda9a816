-- Each customer's spend quartile within their segment. NTILE is refused
-- (docs/supported-sql.md, "Refused, before any SQL runs"), and the model is
-- kept refused on purpose: ivm_fallback recomputes it on every run and
-- writes the table in place with its difference, so the three levels of ivm
-- models below it (mart_quartile_summary, mart_quartile_shares,
-- mart_top_quartile_value) apply only what changed (docs/configuration.md,
-- "ivm_fallback").
--
-- It reads silver models, which may not have published when it runs
-- (with several dbt threads, silver's group commit waits for its slowest
-- member): a fallback table reads such an upstream at the state its group is
-- about to publish, as ivm models do, and the gold models reading this
-- table publish after silver (docs/configuration.md, "ivm_fallback").
{{ config(ivm_fallback='full_refresh') }}
with spend as (
    select o.customer_id, sum(i.net_amount) as lifetime_value
    from {{ ref('slv_order_items') }} i
    join {{ ref('slv_orders') }} o on i.order_id = o.order_id
    where o.status <> 'cancelled'
    group by o.customer_id
)
select
    s.customer_id,
    c.segment,
    s.lifetime_value,
    ntile(4) over (
        partition by c.segment order by s.lifetime_value desc, s.customer_id
    ) as spend_quartile
from spend s
join {{ ref('slv_customers') }} c on s.customer_id = c.customer_id
