"""shmq's pure-Python RocketMQ 4.x client (producers, consumers) will live here.

Nothing is built yet: the package exists so that the install layout of
DESIGN §2 (``shmq.client`` → ``client/``) is in place from the start.
"""
