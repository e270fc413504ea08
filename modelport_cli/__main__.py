"""`python -m modelport_cli ...`, the same as the installed `modelport` script."""

from __future__ import annotations

from modelport_cli.main import main

raise SystemExit(main())
