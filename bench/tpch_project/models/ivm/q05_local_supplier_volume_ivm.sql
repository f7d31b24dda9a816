{{ q05_local_supplier_volume() }}
