"""The rows layer: the one place where a protocol's decoded events become a RowBlock.

One module per protocol holds that protocol's mapping into the ``events``
columns (docs/table.md): :mod:`~appliance.rows.forward`,
:mod:`~appliance.rows.lumberjack`, :mod:`~appliance.rows.courier`,
:mod:`~appliance.rows.websocket` and :mod:`~appliance.rows.logjam`. Beside
them are the shared pieces: :mod:`~appliance.rows.block` (the
:class:`~appliance.rows.block.RowBlock` and its byte accounting),
:mod:`~appliance.rows.records` (a record as JSON text),
:mod:`~appliance.rows.fields` (tag and host by dotted path) and
:mod:`~appliance.rows.timefmt` (RFC 3339 text and epoch nanoseconds).

Import direction: the per-protocol modules import their codec
(``appliance.protocols.*``) and the shared modules. The shared modules import
nothing from ``appliance`` but :mod:`appliance.protocols.text` (the text
rule, which imports no codec), and neither trio, sockets nor pyarrow, so a
codec may use them: the codecs turn records into row values as they decode
them, to bound memory. No codec imports a per-protocol module.
Storing a block (its checks, dedupe identity and Arrow conversion) is the
lake's (:mod:`appliance.lake.blocks`), which imports :class:`RowBlock` from
here. A driver (``appliance.server.*``) keeps the I/O and calls its
protocol's module here for the mapping.

This file re-exports nothing: import the module you need, so that a codec
importing :mod:`~appliance.rows.records` does not load the per-protocol
modules (which import the codecs).
"""
