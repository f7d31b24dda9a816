{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q01_pricing_summary() }}
