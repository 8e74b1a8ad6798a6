"""A TLS-first log-ingest appliance that commits events into Delta Lake.

Protocol codecs live in :mod:`appliance.protocols` (sans-IO), transport
drivers in :mod:`appliance.server`, and the Delta Lake writer in
:mod:`appliance.lake`.
"""

__version__ = "0.1.0"
