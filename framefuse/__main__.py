from framefuse.cli import main

raise SystemExit(main())
