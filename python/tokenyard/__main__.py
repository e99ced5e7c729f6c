from tokenyard.cli import main

raise SystemExit(main())
