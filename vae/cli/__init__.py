"""The command line: ``python -m vae`` / ``vaekit`` (entry.py, importable without PyTorch), its
commands (commands.py) and the node-pack loader that ``run`` uses to execute workflow files (pack.py)."""
