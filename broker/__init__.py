"""The broker's processes and what they run.

- the boss (``boss``): owns the store (recovery, shared memory:
  ``shared_store``), accepts connections and hands them to the workers,
  restarts children; the cold start's kernel compiles (``kernels``) and the
  fork server's preloads (``preload``);
- the workers (``worker``): a reactor (``reactor``) driving the sans-I/O
  request handlers (``handlers/``) over the shared tables (``topics``,
  ``registry``), with parked pulls and sync sends (``parking``), runtime
  stats (``stats``), SQL92 filters (``sql92``) and access control (``acl``);
- the flusher (``flusher``): group commit, checkpoints, retention, disk use;
- the services process (``services``): delayed, timed and transactional
  re-posts (``schedule``, ``delivery``, ``transactions``), the IndexFile,
  the scrub, NameServer registration;
- the NameServer (``namesrv``), embedded or standalone.
Settings: ``config``.
"""
