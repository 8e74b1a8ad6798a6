"""``python -m appliance`` runs the command-line interface."""

from appliance.cli import main

raise SystemExit(main())
