{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q03_shipping_priority() }}
