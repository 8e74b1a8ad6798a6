"""The answering loop's transports: TCP bytes, WebSocket messages, ZeroMQ frames."""
