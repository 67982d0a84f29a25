"""Console subcommands, one module each (see agentkv/cli.py)."""
