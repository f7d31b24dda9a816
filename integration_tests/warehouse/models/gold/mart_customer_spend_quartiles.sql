-- Each customer's spend quartile within their segment, cut at the segment's
-- quartile values. PERCENTILE over a window is refused (docs/supported-sql.md,
-- "Refused, before any SQL runs"), and the model is kept refused on purpose:
-- ivm_fallback recomputes it on every run and writes the table in place with
-- its difference, so the three levels of ivm models below it
-- (mart_quartile_summary, mart_quartile_shares, mart_top_quartile_value)
-- apply only what changed (docs/configuration.md, "ivm_fallback").
--
-- Not NTILE, which is maintained since 2026-12-08: over the four segments
-- every change touches every partition, and the maintained model (two plan
-- nodes, then each segment recomputed) took 85.6 s of a day's batch at scale
-- 1500 where this fallback took 33-39 s (docs/performance.md, "NTILE
-- maintained, measured against its fallback").
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
),
valued as (
    select
        s.customer_id,
        c.segment,
        s.lifetime_value,
        percentile(s.lifetime_value, array(0.25, 0.5, 0.75)) over (
            partition by c.segment
        ) as cuts
    from spend s
    join {{ ref('slv_customers') }} c on s.customer_id = c.customer_id
)
select
    customer_id,
    segment,
    lifetime_value,
    case
        when lifetime_value >= cuts[2] then 1
        when lifetime_value >= cuts[1] then 2
        when lifetime_value >= cuts[0] then 3
        else 4
    end as spend_quartile
from valued
