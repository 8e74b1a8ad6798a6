"""pandas and pyspark stay out of the serving process (appliance/serving_imports.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.appliance.test_one_writer import send_chunk
from tests.support.service import start_appliance


def mapped_packages(pid: int) -> set[str]:
    """The site-packages top-level packages whose files ``pid`` has mapped (its .so files)."""
    found: set[str] = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        _, _, path = line.partition("site-packages/")
        if path:
            found.add(path.split("/")[0])
    return found


def test_pyarrow_works_and_pandas_is_not_installed_for_it() -> None:
    # A fresh interpreter: this test process may have pandas loaded already.
    script = (
        "import sys\n"
        "from appliance.serving_imports import keep_out\n"
        "keep_out(); keep_out()\n"
        "import pyarrow as pa\n"
        "assert pa.array([1, 2], type=pa.int64()).to_pylist() == [1, 2]\n"
        "for name in ('pandas', 'pandas.core', 'pyspark'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ModuleNotFoundError as error:\n"
        "        assert 'kept out of the serving process' in str(error), error\n"
        "    else:\n"
        "        raise AssertionError(name)\n"
        "assert 'pandas' not in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_service_that_has_committed_has_no_pandas_loaded(tmp_path: Path) -> None:
    app = start_appliance(tmp_path, {"forward": ""})
    try:
        # ack = "commit" (start_appliance's default): the ack follows the
        # commit, so the Arrow conversion and the Parquet write have run.
        assert send_chunk(app, app.ports["forward"], "one") == {"ack": "one"}
        assert len(app.rows()) == 100
        loaded = mapped_packages(app.process.pid)
        assert "pyarrow" in loaded, loaded
        assert "deltalake" in loaded, loaded
        assert not loaded & {"pandas", "pyspark"}, loaded
    finally:
        assert app.stop() == 0
