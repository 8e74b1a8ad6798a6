"""What the whole test suite shares (one definition of each):

* :mod:`tests.support.ports`: :func:`~tests.support.ports.free_port`, for an
  address that must be known before a process starts (a listener that can say
  what it bound takes port 0 instead);
* :mod:`tests.support.cli`: the real ``appliance`` command in a subprocess
  (:func:`~tests.support.cli.run_cli`, :func:`~tests.support.cli.start_cli`),
  importing this checkout;
* :mod:`tests.support.service`: ``appliance serve`` as a subprocess, started
  and waited for by polling its log, and the service in-process for a test.

Suites with needs of their own keep a module of their own beside their tests
(tests/hostile/, tests/spark/helpers.py, tests/appliance/server/support.py),
built on these.
"""
