"""The sessions: one module per protocol, turning its codec's events into the loop's actions."""
