{{ q01_pricing_summary() }}
