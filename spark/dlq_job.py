"""Entry point for ``spark-submit spark/dlq_job.py --input PATH --out OUT`` (see ``spark/job.py``).

Run as a file, its directory is first on ``sys.path``; the directory ``postroom`` is imported
from goes there instead (the repository, or the installed package's parent). On a cluster,
``spark/job.py`` ships ``spark/`` and the record format's modules of ``broker/wal/`` to the
executors with the session itself.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    root = os.path.dirname(here)  # the repository, which holds postroom/ (installed: postroom itself)
    if not os.path.isdir(os.path.join(root, "postroom")):
        root = os.path.dirname(root)
    sys.path.insert(0, root)
    from postroom.spark.job import main

    sys.exit(main())
