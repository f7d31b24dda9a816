{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q06_forecast_revenue_change() }}
