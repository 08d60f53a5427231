"""The `{{name}}` deployer: writes a summary of the model's files to
`summary.json` in the deployment's output directory and, when the option
`target` names a publishing target, puts the model's files and the summary
there.

Replace `deploy` with what your deployer does; keep the rest.
"""

import json
import os

# componentize-py generates these modules from wit/ when it builds the
# component (`componentize-py -d wit -w deployer bindings bindings/` writes
# them out to read). WIT names become Python names: `check-options` is
# `check_options`, `options-json` is `options_json`. `host` is what berth
# offers, `publish` its publishing targets.
from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, publish
from wit_world.imports.berth_deployer_types import (
    DeployerInfo,
    DeployRequest,
    DeployResult,
)

import options

NAME = "{{name}}"

# Every option this deployer takes: `describe` publishes them as a JSON
# Schema and `options.parse` refuses anything else.
OPTIONS = [
    options.Option("note", "string", "a line of text written into the summary"),
    options.Option("max_files", "integer", "fail when the model has more files than this", minimum=1),
    options.Option("dry_run", "boolean", "check and report, but write nothing"),
    options.Option("target", "string", "a publishing target to put the model's files and the summary into"),
]

SUMMARY = "summary.json"


# The class must be called Plugin and subclass exports.Plugin: it implements
# the world's exported `plugin` interface.
class Plugin(exports.Plugin):
    def describe(self) -> DeployerInfo:
        return DeployerInfo(
            description="Writes a summary of the model's files to summary.json, and puts both into a publishing target when given one",
            options_schema=options.schema(OPTIONS),
        )

    # Called before anything is fetched: refuse bad options early. Returning
    # (None) accepts them; `raise Err("sentence")` refuses them.
    def check_options(self, options_json: str) -> None:
        options.parse(NAME, OPTIONS, options_json)

    # `raise Err("sentence")` fails the deployment with that sentence; any
    # other exception fails it too, with its traceback in the log.
    def deploy(self, request: DeployRequest) -> DeployResult:
        given = options.parse(NAME, OPTIONS, request.options_json)
        note = given.get("note", "")
        dry_run = given.get("dry_run", False)
        files = request.model.files
        max_files = given.get("max_files")
        if max_files is not None and len(files) > max_files:
            raise Err(f"the model has {len(files)} files, more than max_files ({max_files})")

        listed = []
        total = 0
        for done, file in enumerate(files, 1):
            # The model's files are under request.dir (/model), read-only.
            listed.append({"path": file.path, "size_bytes": file.size_bytes, "sha256": file.sha256})
            total += file.size_bytes
            host.progress(done, len(files), file.path)

        ref = path = os.path.join(request.out_dir, SUMMARY)
        published = []
        if not dry_run:
            summary = {"model": request.model.name, "job_id": request.model.job_id, "note": note, "files": listed}
            try:
                with open(path, "w") as out:
                    json.dump(summary, out)
            except OSError as e:
                raise Err(f"{path}: cannot write the summary: {e.strerror or e}")
            if "target" in given:
                # The host streams each file, checks its sha256 at the
                # destination and records the put; this code never sees the
                # target's credentials. A refused call raises Err(sentence),
                # which fails the deployment with that sentence.
                with publish.Target.open(given["target"]) as target:
                    folder = f"{request.model.job_id}/deploy-{request.deploy_id}"
                    # One call puts every file, a few at once. It raises
                    # nothing for a file that fails: each result is
                    # Ok(receipt) or Err(sentence), in the order given.
                    puts = [(file.path, f"{folder}/{file.path}") for file in files]
                    failed = []
                    for (path, key), put in zip(puts, target.put_model_files(puts)):
                        if isinstance(put, Err):
                            failed.append(f"{path}: {put.value}")
                        else:
                            published.append(put.value.url)
                    if failed:
                        raise Err("; ".join(failed))
                    # A file this deployment wrote under /out; put_bytes puts
                    # bytes made in memory instead.
                    ref = target.put_out_file(SUMMARY, f"{folder}/{SUMMARY}").url
                    published.append(ref)
                    # A folder key (ending in /): where the keys under it
                    # landed, ending in / too.
                    folder_url = target.url(f"{folder}/")
        host.log(host.Level.INFO, f"{ref}: {len(files)} files, {total} bytes")
        details = {"files": len(files), "bytes": total, "written": not dry_run}
        if published:
            details["published"] = published
            details["folder"] = folder_url
        # The WIT field `ref` keeps its name in Python.
        return DeployResult(ref=ref, details_json=json.dumps(details))
