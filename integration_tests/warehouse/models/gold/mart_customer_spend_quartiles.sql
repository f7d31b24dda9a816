-- Each customer's spend quartile within their segment. NTILE is refused
-- (docs/supported-sql.md, "Refused, before any SQL runs"), and the model is
-- kept refused on purpose: ivm_fallback recomputes it on every run and
-- writes the table in place with its difference, so the three levels of ivm
-- models below it (mart_quartile_summary, mart_quartile_shares,
-- mart_top_quartile_value) apply only what changed (docs/configuration.md,
-- "ivm_fallback").
{{ config(ivm_fallback='full_refresh') }}
select
    l.customer_id,
    c.segment,
    l.lifetime_value,
    ntile(4) over (
        partition by c.segment order by l.lifetime_value desc, l.customer_id
    ) as spend_quartile
from {{ ref('mart_customer_ltv') }} l
join {{ ref('dim_customers') }} c on l.customer_id = c.customer_id
