"""Sans-IO protocol codecs: bytes in, frozen events out, bytes of answers back.

No module in this package imports trio, socket or a clock. Each codec is a
state machine that a transport driver feeds with whatever it read and asks for
the bytes of its answers (docs/decisions.md#codecs-are-sans-io).
"""
