"""A real MLflow tracking server for berth's tests.

MLflow (PyPI `mlflow`, pinned and installed into .venv-mlflow by
`scripts/setup test`) on a free loopback port, with a SQLite backend (the
only kind whose webhooks fire) and a local artifact root served through its
artifact proxy (`mlflow-artifacts:/`), in a temporary folder. Webhooks may
call plain http on loopback (`MLFLOW_WEBHOOK_ALLOWED_SCHEMES`,
`MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS`). Prints one JSON line (its URL), then
serves until its standard input closes, which happens when the process that
started it exits, however it exits; then it is stopped and its folder
removed.

    .venv-mlflow/bin/python tests/mlflow/serve.py
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# MLflow does not say which port it took when given 0, so one is chosen
# here: free now, and taken by the server a moment later.
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
url = f"http://127.0.0.1:{port}"

root = tempfile.mkdtemp(prefix="berth-mlflow-")
env = dict(
    os.environ,
    MLFLOW_WEBHOOK_ALLOWED_SCHEMES="http,https",
    MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS="true",
    # Without it a restarted server could not read its webhooks' secrets.
    MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY="YmVydGgtdGVzdHMtb25seS1rZXktMzItYnl0ZXMhIT0=",
    # The webhook list is cached for 60 s by default: a test's new webhook
    # would not be called.
    MLFLOW_WEBHOOK_CACHE_TTL="0",
)
started = time.monotonic()
server = subprocess.Popen(
    [
        os.path.join(os.path.dirname(sys.executable), "mlflow"),
        "server",
        "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--artifacts-destination", f"{root}/artifacts",
        "--serve-artifacts",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
    ],
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    env=env,
    # Its own group, so that its workers stop with it.
    start_new_session=True,
)
try:
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"mlflow server did not start on {url}")
            time.sleep(0.2)
    print(json.dumps({"url": url, "root": root, "start_ms": int((time.monotonic() - started) * 1000)}), flush=True)
    sys.stdin.read()
finally:
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait()
    shutil.rmtree(root, ignore_errors=True)
