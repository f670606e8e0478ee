"""shmq's command line (admin, store inspector, bench runner) and the Spark
data source will live here.

Nothing is built yet: the package exists so that the install layout of
DESIGN §2 (``shmq.tools`` → ``tools/``) is in place from the start.
"""
