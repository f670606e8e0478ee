"""Everything between processes: the shared-memory control block, the append
lock, wake-ups (DESIGN §5)."""
