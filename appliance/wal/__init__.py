"""The write-ahead log: batches become durable here, in CRC-framed segment files, before an ack."""
