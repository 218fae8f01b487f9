"""Entry point for ``spark-submit spark/dlq_job.py --input PATH --out OUT`` (see ``spark/job.py``).

Run as a file, its directory is first on ``sys.path``; the project root goes there instead,
so ``spark`` and ``broker`` import as packages. On a cluster, ship them to the executors
(``spark/job.py`` ships ``spark/`` and the record format's modules of ``broker/wal/`` with the session itself).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.path.dirname(here))
    from spark.job import main

    sys.exit(main())
