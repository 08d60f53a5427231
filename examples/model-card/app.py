"""The `model-card` deployer: writes a README.md model card for a trained
model into the deployment's output directory.

The card is built from what berth recorded about the model (name, base model,
dataset, training numbers and parameters, files with sizes and sha256) and,
when the model has one, from its PEFT `adapter_config.json` (LoRA rank, alpha,
target modules). It never writes anywhere but the out-dir.
"""

import hashlib
import json
import os

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.berth_deployer_types import (
    DeployerInfo,
    DeployRequest,
    DeployResult,
)

CARD_NAME = "README.md"
ADAPTER_CONFIG = "adapter_config.json"
# An adapter config is a few hundred bytes; anything huge is not one.
ADAPTER_CONFIG_MAX_BYTES = 1 << 20
HASH_CHUNK = 1 << 20

OPTIONS_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "title": {
                "type": "string",
                "minLength": 1,
                "description": "the card's title; defaults to the model's name",
            }
        },
        "additionalProperties": False,
    },
    indent=2,
)

# The LoRA settings worth a line on the card, in the order shown.
LORA_FIELDS = [
    ("peft_type", "Method"),
    ("r", "Rank (r)"),
    ("lora_alpha", "Alpha"),
    ("lora_dropout", "Dropout"),
    ("target_modules", "Target modules"),
    ("bias", "Bias"),
    ("task_type", "Task type"),
    ("use_dora", "DoRA"),
    ("use_rslora", "rsLoRA"),
    ("modules_to_save", "Modules saved whole"),
    ("base_model_name_or_path", "Base model (adapter config)"),
]


class Plugin(exports.Plugin):
    def describe(self) -> DeployerInfo:
        return DeployerInfo(
            description="Writes a README.md model card (training data, parameters, "
            "LoRA settings, files and checksums) into the deployment's output directory",
            options_schema=OPTIONS_SCHEMA,
        )

    def check_options(self, options_json: str) -> None:
        parse_options(options_json)

    def deploy(self, request: DeployRequest) -> DeployResult:
        options = parse_options(request.options_json)
        model = request.model
        params = parse_params(model.params_json)
        adapter = read_adapter_config(request)

        card, sections, hashed = render(request, options, params, adapter)
        data = card.encode("utf-8")
        path = os.path.join(request.out_dir, CARD_NAME)
        try:
            with open(path, "wb") as out:
                out.write(data)
        except OSError as e:
            raise Err(f"{path}: cannot write the model card: {e.strerror or e}")

        host.log(host.Level.INFO, f"wrote {path}: {len(data)} bytes, sections {', '.join(sections)}")
        details = {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "sections": sections,
            "files": len(model.files),
            # Files without a recorded sha256 that the card hashed itself.
            "hashed": hashed,
            "adapter_config": adapter is not None,
        }
        return DeployResult(ref=path, details_json=json.dumps(details))


def parse_options(options_json: str) -> dict:
    """Returns the options as a dict, raising Err with a sentence when bad."""
    try:
        options = json.loads(options_json or "{}")
    except ValueError as e:
        raise Err(f"options are not valid JSON: {e}")
    if not isinstance(options, dict):
        raise Err("options must be a JSON object")
    unknown = sorted(key for key in options if key != "title")
    if unknown:
        names = ", ".join(json.dumps(key) for key in unknown)
        raise Err(f"unknown option {names}: the model-card deployer accepts only \"title\" (a string)")
    title = options.get("title")
    if title is not None and (not isinstance(title, str) or not title.strip()):
        raise Err(f"option \"title\" must be a non-empty string, not {json.dumps(title)}")
    return options


def parse_params(params_json: str) -> dict:
    if not params_json:
        return {}
    try:
        params = json.loads(params_json)
    except ValueError:
        # berth stores params as a JSON object; show it raw rather than fail.
        return {"params": params_json}
    return params if isinstance(params, dict) else {"params": params}


def read_adapter_config(request: DeployRequest):
    """The model's adapter_config.json as a dict, or None when it has none.

    The top-level file wins; otherwise the first one in a sub-folder (some
    trainers write `adapter/adapter_config.json`).
    """
    paths = [f.path for f in request.model.files if f.path.rsplit("/", 1)[-1] == ADAPTER_CONFIG]
    if not paths:
        return None
    relative = ADAPTER_CONFIG if ADAPTER_CONFIG in paths else paths[0]
    path = os.path.join(request.dir, relative)
    try:
        with open(path, "rb") as f:
            raw = f.read(ADAPTER_CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise Err(f"{relative}: cannot read it: {e.strerror or e}")
    if len(raw) > ADAPTER_CONFIG_MAX_BYTES:
        raise Err(f"{relative}: larger than {ADAPTER_CONFIG_MAX_BYTES} bytes; not an adapter config")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Err(f"{relative}: not valid JSON: {e}")
    if not isinstance(config, dict):
        raise Err(f"{relative}: expected a JSON object")
    config["_path"] = relative
    return config


def render(request: DeployRequest, options: dict, params: dict, adapter):
    """Returns the card's text, its section names, and how many files it hashed."""
    model = request.model
    lines = []
    sections = []

    def section(name):
        sections.append(name)
        lines.extend(["", f"## {name}", ""])

    title = options.get("title") or model.name or model.job_id
    lines.append(f"# {one_line(title)}")
    lines.append("")
    summary = "A fine-tune"
    if model.base_model:
        summary += f" of `{one_line(model.base_model)}`"
    if model.dataset:
        summary += f" on `{one_line(model.dataset)}`"
    lines.append(
        f"{summary}, trained by job `{one_line(model.job_id)}` and deployed by berth (deployment {request.deploy_id})."
    )

    section("Model")
    rows = [
        ("Name", model.name),
        ("Base model", model.base_model),
        ("Model size", model.model_size),
        ("Training job", model.job_id),
    ]
    table(lines, ("Field", "Value"), [(k, v) for k, v in rows if v != ""])

    section("Training")
    rows = [
        # The contract says "" and 0 where berth recorded nothing.
        ("Dataset", model.dataset or "unknown"),
        ("Examples", str(model.num_examples) if model.num_examples else "unknown"),
        ("Steps", str(model.num_train_steps) if model.num_train_steps else "unknown"),
        ("Final loss", "unknown" if model.final_loss is None else format_loss(model.final_loss)),
    ]
    table(lines, ("Field", "Value"), rows)

    if params:
        section("Training parameters")
        table(lines, ("Parameter", "Value"), [(k, show(v)) for k, v in sorted(params.items())])

    if adapter is not None:
        section("LoRA")
        rows = [(label, show(adapter[key])) for key, label in LORA_FIELDS if key in adapter and adapter[key] is not None]
        if rows:
            table(lines, ("Setting", "Value"), rows)
        else:
            lines.append("The adapter config names none of the usual LoRA settings.")
        lines.append("")
        lines.append(f"From `{adapter['_path']}`.")

    section("Files")
    rows, hashed = file_rows(request)
    table(lines, ("File", "Size", "SHA-256"), rows)
    total = sum(f.size_bytes for f in model.files)
    lines.append("")
    note = f"{len(model.files)} files, {human_size(total)} in all. berth verified every file's size"
    if hashed:
        note += f" and every recorded checksum; {hashed} of them were registered without one, so the card computed theirs."
    else:
        note += " and checksum before this card was written."
    lines.append(note)

    return "\n".join(lines) + "\n", sections, hashed


def file_rows(request: DeployRequest):
    """One row per file. berth checked every recorded sha256; a file recorded
    without one is hashed here, so the card always lists a checksum."""
    rows = []
    hashed = 0
    total = len(request.model.files)
    for done, f in enumerate(request.model.files, 1):
        digest = f.sha256
        if not digest:
            digest = sha256_of(os.path.join(request.dir, f.path), f.path)
            hashed += 1
        rows.append((f"`{f.path}`", size_cell(f.size_bytes), f"`{digest}`"))
        host.progress(done, total, f.path)
    return rows, hashed


def sha256_of(path: str, relative: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                digest.update(chunk)
    except OSError as e:
        raise Err(f"{relative}: cannot read it: {e.strerror or e}")
    return digest.hexdigest()


def table(lines, header, rows):
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        lines.append("| " + " | ".join(cell(value) for value in row) + " |")


def cell(value) -> str:
    # A pipe or a line break would end the cell or the table.
    return one_line(str(value)).replace("|", "\\|")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def show(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return json.dumps(value, sort_keys=True)


def format_loss(loss: float) -> str:
    return f"{loss:.6g}"


def size_cell(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n} bytes ({human_size(n)})"


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
