{{ q06_forecast_revenue_change() }}
