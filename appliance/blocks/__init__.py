"""The block vocabulary: what a batch of rows is, before any package stores or serves it.

Everything here is pure (no I/O, no trio, no socket, no pyarrow) and imports
nothing else of ``appliance``, so every layer of the data's path may use it
without a cycle (docs/architecture.md#import-rules): the codecs
(``appliance.protocols``) check and convert values with it as they decode,
the rows layer (``appliance.rows``) builds blocks, and the write-ahead log
(``appliance.wal``) and the lake (``appliance.lake``) check and identify them.

* :mod:`~appliance.blocks.block`: :class:`~appliance.blocks.block.RowBlock`
  and its byte accounting.
* :mod:`~appliance.blocks.text`: the strict-text rule of every string column.
* :mod:`~appliance.blocks.timefmt`: event times, RFC 3339 text and epoch nanoseconds.
* :mod:`~appliance.blocks.records`: a decoded record as the JSON text of ``record``.
* :mod:`~appliance.blocks.fields`: tag and host picked out of a record by dotted path.
* :mod:`~appliance.blocks.identity`: a batch's dedupe key and its digest.
* :mod:`~appliance.blocks.checks`: :func:`~appliance.blocks.checks.check_block`,
  whether a block can be stored.
* :mod:`~appliance.blocks.errors`: the errors those checks raise.

This file re-exports nothing: import the module you need.
"""
