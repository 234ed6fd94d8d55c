"""Spark for the reconciler: :mod:`.session` (the driver: a session, the build job as
``map_files``) and :mod:`.tasks` (what runs in the Spark tasks). The Spark app
(``spark_apps/reconcile.py``), ``ctp reconcile`` and ``ctp demo`` are thin mains over
these."""
