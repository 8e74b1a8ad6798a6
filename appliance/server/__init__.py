"""Transport drivers: trio tasks that own sockets, deadlines and TLS, and no parsing."""
