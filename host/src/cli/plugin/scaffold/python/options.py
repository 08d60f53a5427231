"""The deployer's options: one list of `Option`s gives both the JSON Schema
that `describe` publishes and the checks `check_options` and `deploy` run, so
the two never disagree. Errors are raised as Err(sentence) for the person
deploying."""

import json

from componentize_py_types import Err


class Option:
    """One option: its name, JSON type (string, integer or boolean) and, for
    integers, optional bounds."""

    def __init__(self, name, kind, description, minimum=None, maximum=None):
        if kind not in ("string", "integer", "boolean"):
            raise ValueError(f"option {name}: unknown kind {kind!r}")
        self.name = name
        self.kind = kind
        self.description = description
        self.minimum = minimum
        self.maximum = maximum

    def schema(self) -> dict:
        schema = {"type": self.kind}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        schema["description"] = self.description
        return schema

    def check(self, value):
        if self.kind == "string":
            fits, expected = isinstance(value, str), "a string"
        elif self.kind == "boolean":
            fits, expected = isinstance(value, bool), "true or false"
        else:
            # JSON true/false are Python bools, which are also ints.
            fits = isinstance(value, int) and not isinstance(value, bool)
            fits = fits and (self.minimum is None or value >= self.minimum)
            fits = fits and (self.maximum is None or value <= self.maximum)
            if self.minimum is not None and self.maximum is not None:
                expected = f"an integer from {self.minimum} to {self.maximum}"
            elif self.minimum is not None:
                expected = f"an integer of at least {self.minimum}"
            elif self.maximum is not None:
                expected = f"an integer of at most {self.maximum}"
            else:
                expected = "an integer"
        if not fits:
            raise Err(f"option {json.dumps(self.name)} must be {expected}, not {json.dumps(value)}")


def schema(specs) -> str:
    """The JSON Schema of the options object: these properties and no others."""
    return json.dumps(
        {
            "type": "object",
            "properties": {spec.name: spec.schema() for spec in specs},
            "additionalProperties": False,
        }
    )


def parse(deployer: str, specs, options_json: str) -> dict:
    """The options object, once every key is known and every value has its
    spec's type and bounds; absent options are absent."""
    try:
        given = json.loads(options_json)
    except ValueError as e:
        raise Err(f"options are not valid JSON: {e}")
    if not isinstance(given, dict):
        raise Err("options must be a JSON object")
    known = {spec.name: spec for spec in specs}
    unknown = sorted(key for key in given if key not in known)
    if unknown:
        names = ", ".join(json.dumps(key) for key in unknown)
        accepted = ", ".join(json.dumps(spec.name) for spec in specs)
        plural = "s" if len(unknown) > 1 else ""
        raise Err(f"unknown option{plural} {names}: the {deployer} deployer accepts only {accepted}")
    for key, value in given.items():
        known[key].check(value)
    return given
