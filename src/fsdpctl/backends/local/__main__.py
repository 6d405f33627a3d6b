"""The local job's supervisor process: `python -m fsdpctl.backends.local JOB_DIR` (started detached
by `engine.start`; the loop is supervisor.supervise)."""

import sys
from pathlib import Path

from fsdpctl.backends.local.engine import supervise

sys.exit(supervise(Path(sys.argv[1])))
