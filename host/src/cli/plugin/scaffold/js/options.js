// The deployer's options: one list of `Option`s gives both the JSON Schema
// that `describe` publishes and the checks `checkOptions` and `deploy` run,
// so the two never disagree. Errors are thrown as sentences (strings) for the
// person deploying.

const KINDS = ['string', 'integer', 'boolean'];

/// One option: its name, JSON type (string, integer or boolean) and, for
/// integers, optional bounds.
export class Option {
  constructor(name, kind, description, { minimum, maximum } = {}) {
    if (!KINDS.includes(kind)) {
      throw `option ${name}: unknown kind ${JSON.stringify(kind)}`;
    }
    Object.assign(this, { name, kind, description, minimum, maximum });
  }

  schema() {
    const schema = { type: this.kind };
    if (this.minimum !== undefined) schema.minimum = this.minimum;
    if (this.maximum !== undefined) schema.maximum = this.maximum;
    schema.description = this.description;
    return schema;
  }

  check(value) {
    let fits;
    let expected;
    if (this.kind === 'string') {
      [fits, expected] = [typeof value === 'string', 'a string'];
    } else if (this.kind === 'boolean') {
      [fits, expected] = [typeof value === 'boolean', 'true or false'];
    } else {
      fits = Number.isSafeInteger(value) &&
        (this.minimum === undefined || value >= this.minimum) &&
        (this.maximum === undefined || value <= this.maximum);
      if (this.minimum !== undefined && this.maximum !== undefined) {
        expected = `an integer from ${this.minimum} to ${this.maximum}`;
      } else if (this.minimum !== undefined) {
        expected = `an integer of at least ${this.minimum}`;
      } else if (this.maximum !== undefined) {
        expected = `an integer of at most ${this.maximum}`;
      } else {
        expected = 'an integer';
      }
    }
    if (!fits) {
      throw `option ${JSON.stringify(this.name)} must be ${expected}, not ${JSON.stringify(value)}`;
    }
  }
}

/// The JSON Schema of the options object: these properties and no others.
export function schema(specs) {
  return JSON.stringify({
    type: 'object',
    properties: Object.fromEntries(specs.map((spec) => [spec.name, spec.schema()])),
    additionalProperties: false,
  });
}

/// The options object, once every key is known and every value has its
/// spec's type and bounds; absent options are absent.
export function parseOptions(deployer, specs, optionsJson) {
  let given;
  try {
    given = JSON.parse(optionsJson);
  } catch (e) {
    throw `options are not valid JSON: ${e.message}`;
  }
  if (given === null || typeof given !== 'object' || Array.isArray(given)) {
    throw 'options must be a JSON object';
  }
  const known = new Map(specs.map((spec) => [spec.name, spec]));
  const unknown = Object.keys(given).filter((key) => !known.has(key)).sort();
  if (unknown.length > 0) {
    const names = unknown.map((key) => JSON.stringify(key)).join(', ');
    const accepted = specs.map((spec) => JSON.stringify(spec.name)).join(', ');
    throw `unknown option${unknown.length > 1 ? 's' : ''} ${names}: the ${deployer} deployer accepts only ${accepted}`;
  }
  for (const [key, value] of Object.entries(given)) {
    known.get(key).check(value);
  }
  return given;
}
