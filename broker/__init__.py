"""The server roles. So far: the store's owner and the flush process."""
