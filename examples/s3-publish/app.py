"""The `s3-publish` deployer: puts every file of a model, and a small JSON
manifest of what it put, into a publishing target (a bucket) under
`{prefix}/{job_id}/deploy-{deploy_id}/`.

It holds no credential and moves no byte itself: the host streams each file
from disk to the target the operator configured, checks its sha256 at the
destination and hands back a receipt. A file that `stat` finds already there
with the same size (put by an earlier run with the same deployment id, as
repeated trial runs with `berth plugin run` have) is not put twice.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, publish
from wit_world.imports.berth_deployer_types import (
    DeployerInfo,
    DeployRequest,
    DeployResult,
)

MANIFEST = "manifest.json"

OPTIONS_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "target": {
                "type": "string",
                "minLength": 1,
                "description": "the publishing target to put the model into, by name; "
                "it may be left out when the deployer is granted exactly one",
            },
            "prefix": {
                "type": "string",
                "default": "",
                "description": "a key prefix under the target (a/b): files go to "
                "{prefix}/{job_id}/deploy-{deploy_id}/{path}",
            },
        },
        "required": ["target"],
        "additionalProperties": False,
    },
    indent=2,
)


class Plugin(exports.Plugin):
    def describe(self) -> DeployerInfo:
        return DeployerInfo(
            description="Puts the model's files and a JSON manifest of them into a publishing "
            "target (an S3 bucket) under {prefix}/{job_id}/deploy-{deploy_id}/",
            options_schema=OPTIONS_SCHEMA,
        )

    def check_options(self, options_json: str) -> None:
        parse_options(options_json)

    def deploy(self, request: DeployRequest) -> DeployResult:
        options = parse_options(request.options_json)
        model = request.model
        folder = "/".join(filter(None, [options["prefix"], model.job_id, f"deploy-{request.deploy_id}"]))
        with publish.Target.open(options["target"]) as target:
            entries = {}
            to_put = []
            for file in model.files:
                key = f"{folder}/{file.path}"
                there = target.stat(key)
                if there is not None and there.bytes == file.size_bytes:
                    host.log(host.Level.INFO, f"{key}: already there with its {there.bytes} bytes, not put again")
                    entry = {"url": target.url(key), "bytes": there.bytes, "sha256": file.sha256, "etag": there.etag}
                    entries[file.path] = {"path": file.path, "key": key, "skipped": True, **entry}
                else:
                    to_put.append((file.path, key))
            # One call for the rest: the host puts a few at once.
            failed = []
            for (path, key), put in zip(to_put, target.put_model_files(to_put)):
                if isinstance(put, Err):
                    failed.append(put.value)
                else:
                    entries[path] = {"path": path, "key": key, "skipped": False, **vars(put.value)}
            if failed:
                raise Err("; ".join(failed))
            files = [entries[file.path] for file in model.files]
            manifest = {
                "model": model.name,
                "model_id": model.id,
                "job_id": model.job_id,
                "deploy_id": request.deploy_id,
                "files": files,
            }
            key = f"{folder}/{MANIFEST}"
            receipt = target.put_bytes(key, json.dumps(manifest, indent=2).encode(), "application/json")
        total = sum(f["bytes"] for f in files)
        host.log(host.Level.INFO, f"{receipt.url}: {len(files)} files, {total} bytes")
        details = {
            "target": options["target"],
            "files": len(files),
            "bytes": total,
            "skipped": sum(f["skipped"] for f in files),
            "keys": [f["key"] for f in files] + [key],
        }
        return DeployResult(ref=receipt.url, details_json=json.dumps(details))


def parse_options(options_json: str) -> dict:
    """The options with their defaults, raising Err with a sentence when bad."""
    try:
        options = json.loads(options_json or "{}")
    except ValueError as e:
        raise Err(f"options are not valid JSON: {e}")
    if not isinstance(options, dict):
        raise Err("options must be a JSON object")
    unknown = sorted(key for key in options if key not in ("target", "prefix"))
    if unknown:
        names = ", ".join(json.dumps(key) for key in unknown)
        raise Err(
            f"unknown option {names}: the s3-publish deployer accepts only \"target\" "
            "(a publishing target's name) and \"prefix\" (a key prefix)"
        )
    target = options.get("target")
    if target is None:
        raise Err(
            "option \"target\" is missing: name the publishing target to put the model into "
            "(it may be left out only when the deployer is granted exactly one)"
        )
    if not isinstance(target, str) or not target:
        raise Err(f"option \"target\" must be a target's name, not {json.dumps(target)}")
    prefix = options.get("prefix", "")
    if not isinstance(prefix, str):
        raise Err(f"option \"prefix\" must be a string, not {json.dumps(prefix)}")
    prefix = prefix.strip("/")
    if prefix and any(segment in ("", ".", "..") for segment in prefix.split("/")):
        raise Err(
            f"option \"prefix\" {json.dumps(options['prefix'])} has an empty, . or .. segment; "
            "write it as a/b"
        )
    return {"target": target, "prefix": prefix}
