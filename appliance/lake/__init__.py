"""The Delta Lake side of the appliance: the ``events`` table and its group-commit writer."""
