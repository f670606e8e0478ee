"""The storage engine: files and bytes, never sockets or processes (DESIGN §4)."""
