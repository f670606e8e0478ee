"""shmq's command line and operator tools: ``shmq broker`` and ``shmq
namesrv`` (``cli``), ``shmq admin`` (mqadmin's commands: ``admin*``),
``shmq store inspect`` (read-only: ``storeview``, ``storecheck``,
``inspect*``), ``shmq bench`` and ``shmq profile`` (perf's runner under
py-spy: ``bench``, ``profile``), and the PySpark data source (``spark``)."""
