"""`python -m worker` runs the `callgate` command line."""

from worker.cli import main

raise SystemExit(main())
