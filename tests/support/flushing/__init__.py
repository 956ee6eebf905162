"""A test-only app whose `flush` empties only the tables that hold rows (see its command)."""
