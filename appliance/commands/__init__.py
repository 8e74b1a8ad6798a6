"""The CLI's command groups, one module each (``appliance cert ...``, ...)."""
