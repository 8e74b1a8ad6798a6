"""The auth database's revisions, one module each (``NNNN_what.py``)."""
