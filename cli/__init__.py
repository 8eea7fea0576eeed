"""The ``memprof`` command line: the application layer over the profiler, the planner and the dashboard.

Dependencies point one way, cli -> dashboard -> planner -> memprof. :func:`cli.main.main` is the console
entry point; each command is a module with ``register(subparsers)`` and the function it runs.
"""

from cli.main import COMMANDS, EXIT_BAD_INPUT, EXIT_INTERRUPTED, build_parser, main

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "build_parser", "main"]
