"""Read-only query helpers for the dashboard pages (no N+1: each page asserts its query count)."""
