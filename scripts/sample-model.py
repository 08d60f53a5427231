#!/usr/bin/env python3
"""Writes a small but real LoRA-adapter-shaped training run into
DIR/JOB_ID/: PEFT's adapter_config.json and adapter_model.safetensors,
Trainer's trainer_state.json, a tokenizer file. `berth models register
DIR/JOB_ID` reads it as a user's own run (scripts/demo does).

usage: sample-model.py DIR JOB_ID

The files are deterministic, so running it twice gives the same hashes.
"""
import json
import os
import random
import struct
import sys


def safetensors(tensors):
    """A valid .safetensors file: 8-byte little-endian header length, JSON
    header with dtype/shape/data_offsets, then the raw tensor bytes."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    rng = random.Random(7)
    for name, shape in tensors:
        count = 1
        for dim in shape:
            count *= dim
        blob = struct.pack(f"<{count}f", *(rng.uniform(-0.02, 0.02) for _ in range(count)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, job_id = sys.argv[1], sys.argv[2]
    rank, hidden = 8, 256
    tensors = []
    for layer in range(4):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.layers.{layer}.self_attn.{proj}"
            tensors.append((f"{prefix}.lora_A.weight", [rank, hidden]))
            tensors.append((f"{prefix}.lora_B.weight", [hidden, rank]))
    files = {
        "adapter_config.json": json.dumps(
            {
                "base_model_name_or_path": "meta-llama/Llama-3.1-8B",
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 16,
                "lora_dropout": 0.05,
                "target_modules": ["q_proj", "v_proj"],
            },
            indent=2,
        ).encode(),
        "adapter_model.safetensors": safetensors(tensors),
        "tokenizer/special_tokens_map.json": json.dumps(
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
        ).encode(),
        "trainer_state.json": json.dumps(
            {
                "global_step": 750,
                "log_history": [
                    {"step": 375, "loss": 1.0625},
                    {"step": 750, "loss": 0.8125},
                ],
            },
            indent=2,
        ).encode(),
    }
    for path, data in files.items():
        target = os.path.join(root, job_id, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
