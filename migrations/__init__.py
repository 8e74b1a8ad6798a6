"""Alembic environment and revisions of the auth database.

Run through :mod:`auth.schema` (``appliance db upgrade``): the Alembic
configuration is built in code with ``script_location`` pointing at this
package's directory, so no ``alembic.ini`` is needed on disk.
"""
