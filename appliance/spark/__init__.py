"""Spark over the appliance's Delta tables: sessions, table registration, derived-table jobs.

The same code runs on a classic local session configured with delta-spark and
over Spark Connect (an Apache Spark server with Delta, or Sail); see
docs/spark.md. pyspark is imported only when a session is built, so the rest
of the appliance works without the ``spark`` extra.
"""
