"""Event-driven fleet simulator for co-located and PD-disaggregated serving (pure)."""
