"""Peer authentication: the credential database and its checks.

The models, the Fluentd handshake checks and the admin CLI arrive with the
authentication issue; until then every listener runs without a handshake.
"""
