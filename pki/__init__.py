"""The appliance's own PKI: its CA, server certificates and TLS contexts."""
