"""An S3-compatible server for berth's tests and benchmarks.

moto's server (`moto[server]`, installed into .venv by `scripts/setup test`) on a
free loopback port, with one IAM user allowed everything in S3 and the
buckets named on the command line. Prints one JSON line (endpoint, region,
the user's keys), then serves until its standard input closes, which
happens when the process that started it exits, however it exits.

    .venv/bin/python tests/moto/serve.py BUCKET...
"""

import json
import logging
import os
import sys

# The three IAM calls below go unsigned; every later request must be signed
# with keys moto knows, so wrong credentials are refused as by a real store.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"

import boto3  # noqa: E402
from moto.moto_server.threaded_moto_server import ThreadedMotoServer  # noqa: E402

REGION = "us-east-1"

logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
endpoint = f"http://{host}:{port}"

unsigned = {"aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, **unsigned)
iam.create_user(UserName="berth")
iam.put_user_policy(
    UserName="berth",
    PolicyName="s3",
    PolicyDocument=json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
    ),
)
key = iam.create_access_key(UserName="berth")["AccessKey"]

s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name=REGION,
    aws_access_key_id=key["AccessKeyId"],
    aws_secret_access_key=key["SecretAccessKey"],
)
for bucket in sys.argv[1:]:
    s3.create_bucket(Bucket=bucket)

print(
    json.dumps(
        {
            "endpoint": endpoint,
            "region": REGION,
            "access_key_id": key["AccessKeyId"],
            "secret_access_key": key["SecretAccessKey"],
        }
    ),
    flush=True,
)
sys.stdin.read()
