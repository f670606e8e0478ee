"""shmq's command line and operator tools: ``shmq broker`` and ``shmq
namesrv`` (``cli``), ``shmq admin`` (mqadmin's commands: ``admin*``),
``shmq store inspect`` (read-only: ``storecheck``, ``inspect*``), and
``shmq bench`` / ``shmq profile``, which start perf's runner from the
checkout (``bench``, ``profile``)."""
