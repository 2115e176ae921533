"""The Python client is light: importing it loads neither numpy nor the server's web stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("numpy", "flask", "werkzeug", "gunicorn", "redis", "service")


def test_importing_the_client_loads_neither_numpy_nor_flask():
    code = f"import json, sys; from edgecut import Client; print(json.dumps(sorted(m for m in {SERVER_ONLY!r} if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=True)
    assert json.loads(result.stdout) == []
