{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q10_returned_item_reporting() }}
