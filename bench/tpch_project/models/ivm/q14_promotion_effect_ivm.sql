{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q14_promotion_effect() }}
