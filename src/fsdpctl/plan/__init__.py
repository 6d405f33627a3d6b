"""plan: see its modules."""
