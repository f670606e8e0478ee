"""shmq's command line (``shmq broker``, ``shmq namesrv``); the admin tools,
store inspector, bench runner and Spark data source join it later."""
