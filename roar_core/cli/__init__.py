"""The roar-core command line: `entry` (the `roar-core run` fast path), `commands`
(click), `views` (what commands print), `run` (the runner: a producer of the task log),
`graph` (HTML/SVG/DOT)."""
