"""cluster: see its modules."""
