"""``python -m fedsweep ...``: the ``fedsweep`` command, for an environment whose scripts are not on PATH."""
import os

from fedsweep.cli import entry

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    entry()
