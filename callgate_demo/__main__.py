"""`python -m callgate_demo` runs the `callgate-demo` command line."""

from callgate_demo.cli import main

raise SystemExit(main())
