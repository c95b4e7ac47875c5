import sys

from .entry import main

sys.exit(main(prog="python -m vae"))
