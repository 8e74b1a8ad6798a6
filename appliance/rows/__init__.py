"""The rows layer: the one place where a protocol's decoded events become a RowBlock.

One module per protocol holds that protocol's mapping into the ``events``
columns (docs/table.md): :mod:`~appliance.rows.forward`,
:mod:`~appliance.rows.lumberjack`, :mod:`~appliance.rows.courier`,
:mod:`~appliance.rows.websocket` and :mod:`~appliance.rows.logjam`. Beside
them, what they build with is the block vocabulary of :mod:`appliance.blocks`
(:class:`~appliance.blocks.block.RowBlock`, a record as JSON text, tag and
host by dotted path, times, the strict-text rule).

Import direction (docs/architecture.md#import-rules): the per-protocol
modules import their codec (``appliance.protocols.*``) and
:mod:`appliance.blocks`; no codec imports this package (the codecs turn
records into row values as they decode them, to bound memory, with
:mod:`appliance.blocks` alone). Storing a block (its Arrow form, the commit)
is the lake's, logging it the write-ahead log's; neither imports this
package. A driver (``appliance.server.*``) keeps the I/O and calls its
protocol's module here for the mapping.
"""
