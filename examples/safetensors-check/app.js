// The `safetensors-check` deployer: checks that every .safetensors file of a
// model is well formed before anything downstream loads it, and reports what
// the files hold (tensors, dtypes, parameters).
//
// It reads only each file's 8-byte header length and JSON header, never the
// tensor bytes: StarlingMonkey interprets JavaScript without a JIT, so a loop
// over gigabytes of weights would take minutes. Everything that can be
// checked from the header and the file's size is checked.
//
// JavaScript has no file API here, so the model is read through the world's
// wasi:filesystem imports. Errors are returned by throwing a string (an Error
// object would abort the guest instead of producing `err`).

import { log, progress } from 'berth:deployer/host@0.1.0';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

const EXTENSION = '.safetensors';
// Beside a sharded model's shards: which tensor is in which file.
const INDEX_EXTENSION = '.safetensors.index.json';
// The safetensors format itself refuses headers over 100 MB.
const MAX_HEADER_BYTES = 100_000_000;
const METADATA_KEY = '__metadata__';

// Bits per element of every dtype the safetensors format defines.
const DTYPE_BITS = {
  BOOL: 8, U8: 8, I8: 8, F8_E5M2: 8, F8_E4M3: 8, F8_E8M0: 8,
  I16: 16, U16: 16, F16: 16, BF16: 16,
  I32: 32, U32: 32, F32: 32,
  I64: 64, U64: 64, F64: 64, C64: 64,
  F4: 4, F6_E2M3: 6, F6_E3M2: 6,
};

const OPTIONS_SCHEMA = JSON.stringify({
  type: 'object',
  properties: {
    allowed_dtypes: {
      type: 'array',
      items: { enum: Object.keys(DTYPE_BITS) },
      minItems: 1,
      description: 'fail when a tensor has a dtype not in this list (default: any)',
    },
  },
  additionalProperties: false,
});

export const plugin = {
  describe() {
    return {
      description:
        "Checks every .safetensors file of the model (header, dtypes, shapes, offsets) and reports its tensors and parameter count",
      optionsSchema: OPTIONS_SCHEMA,
    };
  },

  checkOptions(optionsJson) {
    parseOptions(optionsJson);
  },

  deploy(request) {
    const options = parseOptions(request.optionsJson);
    const files = request.model.files.filter((f) => f.path.endsWith(EXTENSION));
    if (files.length === 0) {
      throw `the model has no ${EXTENSION} files among its ${request.model.files.length} files: nothing to check`;
    }
    const dir = preopen(request.dir);

    const summaries = new Map();
    for (const [index, file] of files.entries()) {
      try {
        summaries.set(file.path, checkFile(dir, file.path, options));
      } catch (problem) {
        throw `${file.path}: ${describeProblem(problem)}`;
      }
      progress(BigInt(index + 1), BigInt(files.length), file.path);
    }
    const paths = request.model.files.map((f) => f.path);
    for (const index of paths.filter((p) => p.endsWith(INDEX_EXTENSION))) {
      try {
        checkIndex(dir, index, paths, summaries);
      } catch (problem) {
        throw `${index}: ${describeProblem(problem)}`;
      }
    }

    // Each file's bytes are counted once, however many paths hold them.
    const counted = new Set();
    const dtypes = {};
    let tensors = 0;
    let parameters = 0n;
    let bytes = 0;
    const perFile = {};
    for (const file of files) {
      const summary = summaries.get(file.path);
      perFile[file.path] = { tensors: summary.tensors, parameters: toJsonNumber(summary.parameters) };
      const identity = file.sha256 ?? file.path;
      if (counted.has(identity)) {
        continue;
      }
      counted.add(identity);
      tensors += summary.tensors;
      parameters += summary.parameters;
      bytes += summary.size;
      for (const [dtype, count] of Object.entries(summary.dtypes)) {
        dtypes[dtype] = (dtypes[dtype] ?? 0) + count;
      }
    }

    const params = toJsonNumber(parameters);
    log('info', `checked ${files.length} files: ${tensors} tensors, ${params} parameters`);
    return {
      ref: `ok: ${tensors} tensors, ${params} parameters`,
      detailsJson: JSON.stringify({
        files: files.length,
        tensors,
        dtypes: sortedObject(dtypes),
        parameters: params,
        data_bytes: bytes,
        per_file: sortedObject(perFile),
      }),
    };
  },
};

/// A sharded model's index (`model.safetensors.index.json`): every shard
/// its `weight_map` names must be among the model's files, hold exactly
/// the tensors the index gives it, and no shard of the same name pattern
/// beside it may be left out of the index.
function checkIndex(dir, indexPath, paths, summaries) {
  const folder = indexPath.includes('/') ? indexPath.slice(0, indexPath.lastIndexOf('/') + 1) : '';
  const file = dir.openAt({ symlinkFollow: false }, indexPath, {}, { read: true });
  let index;
  try {
    const size = Number(file.stat().size);
    if (size > MAX_HEADER_BYTES) {
      throw `the index is ${size} bytes, more than ${MAX_HEADER_BYTES}`;
    }
    try {
      index = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(readExactly(file, 0, size)));
    } catch (e) {
      throw typeof e === 'string' ? e : `the index is not valid JSON: ${e.message}`;
    }
  } finally {
    file[Symbol.dispose]?.();
  }
  const map = index?.weight_map;
  if (map === null || typeof map !== 'object' || Array.isArray(map)) {
    throw 'the index has no weight_map object';
  }
  const byShard = new Map();
  for (const [tensor, shard] of Object.entries(map)) {
    if (typeof shard !== 'string') {
      throw `weight_map gives tensor ${JSON.stringify(tensor)} a shard that is not a file name`;
    }
    if (!byShard.has(shard)) {
      byShard.set(shard, []);
    }
    byShard.get(shard).push(tensor);
  }
  for (const [shard, tensors] of byShard) {
    const summary = summaries.get(folder + shard);
    if (!summary) {
      throw `shard ${folder + shard} is missing: the index puts ${tensors.length} tensors in it, and the model has no such file`;
    }
    const held = new Set(summary.names);
    const absent = tensors.find((t) => !held.has(t));
    if (absent !== undefined) {
      throw `tensor ${JSON.stringify(absent)} is in ${folder + shard} by the index, but not in that file's header`;
    }
    const named = new Set(tensors);
    const extra = summary.names.find((t) => !named.has(t));
    if (extra !== undefined) {
      throw `${folder + shard} holds tensor ${JSON.stringify(extra)}, which the index does not list`;
    }
  }
  const stem = indexPath.slice(folder.length, -INDEX_EXTENSION.length);
  const pattern = new RegExp(`^${stem.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}-\\d+-of-\\d+\\${EXTENSION}$`);
  const stray = paths.find((p) => {
    const name = p.slice(folder.length);
    return p.startsWith(folder) && !name.includes('/') && pattern.test(name) && !byShard.has(name);
  });
  if (stray !== undefined) {
    throw `${stray} looks like one of its shards, but the index does not name it (a shard of another save?)`;
  }
}

/// Returns `{ allowedDtypes: Set | null }`, throwing a sentence when bad.
function parseOptions(optionsJson) {
  let options;
  try {
    options = JSON.parse(optionsJson || '{}');
  } catch (e) {
    throw `options are not valid JSON: ${e.message}`;
  }
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw 'options must be a JSON object';
  }
  const unknown = Object.keys(options).filter((k) => k !== 'allowed_dtypes');
  if (unknown.length > 0) {
    const names = unknown.map((k) => JSON.stringify(k)).join(', ');
    throw `unknown option ${names}: the safetensors-check deployer accepts only "allowed_dtypes" (a list of dtypes)`;
  }
  const allowed = options.allowed_dtypes;
  if (allowed === undefined) {
    return { allowedDtypes: null };
  }
  if (!Array.isArray(allowed) || allowed.length === 0) {
    throw `option "allowed_dtypes" must be a non-empty list of dtypes, not ${JSON.stringify(allowed)}`;
  }
  const bad = allowed.filter((d) => !Object.hasOwn(DTYPE_BITS, d));
  if (bad.length > 0) {
    throw `option "allowed_dtypes": unknown dtype ${bad.map((d) => JSON.stringify(d)).join(', ')}; ` +
      `expected some of ${Object.keys(DTYPE_BITS).join(', ')}`;
  }
  return { allowedDtypes: new Set(allowed) };
}

/// The preopened directory mounted at `guestPath` (the model's, `/model`).
function preopen(guestPath) {
  const found = getDirectories().find(([, path]) => path === guestPath);
  if (!found) {
    throw `the model directory ${guestPath} is not mounted in this sandbox`;
  }
  return found[0];
}

/// Checks one file; returns what it holds. Throws a problem (string or a
/// WASI error) without the file's name; the caller adds it.
function checkFile(dir, path, options) {
  const file = dir.openAt({ symlinkFollow: false }, path, {}, { read: true });
  try {
    const size = Number(file.stat().size);
    if (size < 8) {
      throw `the file has ${size} bytes, too few for the 8-byte header length (truncated?)`;
    }
    const headerLength = new DataView(readExactly(file, 0, 8).buffer).getBigUint64(0, true);
    if (headerLength > BigInt(MAX_HEADER_BYTES)) {
      throw `header length ${headerLength} is over the format's limit of ${MAX_HEADER_BYTES} bytes (not a safetensors file?)`;
    }
    const n = Number(headerLength);
    if (n > size - 8) {
      throw `header length ${n} is more than the ${size - 8} bytes after it (truncated?)`;
    }
    let header;
    try {
      header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(readExactly(file, 8, n)));
    } catch (e) {
      throw `the header is not valid JSON: ${e.message}`;
    }
    return checkHeader(header, size - 8 - n, options);
  } finally {
    file[Symbol.dispose]?.();
  }
}

/// Reads `length` bytes at `offset`, however many reads that takes.
function readExactly(file, offset, length) {
  const out = new Uint8Array(length);
  let filled = 0;
  while (filled < length) {
    const [chunk, eof] = file.read(BigInt(length - filled), BigInt(offset + filled));
    out.set(chunk, filled);
    filled += chunk.length;
    if (filled < length && (eof || chunk.length === 0)) {
      throw `the file ended after ${offset + filled} bytes while reading ${length} bytes at ${offset} (truncated?)`;
    }
  }
  return out;
}

/// Checks a parsed header against the data section's length.
function checkHeader(header, dataLength, { allowedDtypes }) {
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw 'the header is not a JSON object';
  }
  const spans = [];
  const dtypes = {};
  let parameters = 0n;
  for (const [name, tensor] of Object.entries(header)) {
    if (name === METADATA_KEY) {
      checkMetadata(tensor);
      continue;
    }
    const where = `tensor ${JSON.stringify(name)}`;
    if (tensor === null || typeof tensor !== 'object' || Array.isArray(tensor)) {
      throw `${where}: expected an object with dtype, shape and data_offsets`;
    }
    const { dtype, shape, data_offsets: offsets } = tensor;
    if (!Object.hasOwn(DTYPE_BITS, dtype)) {
      throw `${where}: ${dtype === undefined ? 'no dtype' : `unknown dtype ${JSON.stringify(dtype)}`}`;
    }
    if (allowedDtypes && !allowedDtypes.has(dtype)) {
      throw `${where}: dtype ${dtype} is not among the allowed ${[...allowedDtypes].join(', ')}`;
    }
    if (!Array.isArray(shape) || !shape.every(isCount)) {
      throw `${where}: shape must be a list of non-negative integers, not ${JSON.stringify(shape)}`;
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isCount)) {
      throw `${where}: data_offsets must be two non-negative integers, not ${JSON.stringify(offsets)}`;
    }
    const [begin, end] = offsets;
    if (begin > end) {
      throw `${where}: data_offsets [${begin}, ${end}] end before they begin`;
    }
    if (end > dataLength) {
      throw `${where}: data_offsets [${begin}, ${end}] reach past the end of the data section, ${dataLength} bytes long (truncated file or wrong header?)`;
    }
    const elements = shape.reduce((product, dim) => product * BigInt(dim), 1n);
    const bits = elements * BigInt(DTYPE_BITS[dtype]);
    const span = BigInt(end - begin);
    if (bits % 8n !== 0n || bits / 8n !== span) {
      throw `${where}: ${dtype} shape [${shape.join(', ')}] needs ${bits % 8n === 0n ? bits / 8n : `${bits} bits, not whole`} bytes, ` +
        `but data_offsets [${begin}, ${end}] span ${span}`;
    }
    spans.push({ name, begin, end });
    dtypes[dtype] = (dtypes[dtype] ?? 0) + 1;
    parameters += elements;
  }
  checkCoverage(spans, dataLength);
  return { tensors: spans.length, names: spans.map((s) => s.name), dtypes, parameters, size: dataLength };
}

/// The tensors, in offset order, must tile the data section exactly: no
/// overlap, no gap, nothing after the last.
function checkCoverage(spans, dataLength) {
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let at = 0;
  let previous = null;
  for (const span of spans) {
    if (span.begin < at) {
      throw `tensor ${JSON.stringify(span.name)} [${span.begin}, ${span.end}] overlaps tensor ${JSON.stringify(previous.name)} [${previous.begin}, ${previous.end}]`;
    }
    if (span.begin > at) {
      throw `bytes ${at}..${span.begin} of the data section belong to no tensor (before tensor ${JSON.stringify(span.name)})`;
    }
    at = span.end;
    previous = span;
  }
  if (at !== dataLength) {
    throw `the tensors cover ${at} bytes but the data section has ${dataLength} (${dataLength - at} bytes belong to no tensor)`;
  }
}

function checkMetadata(metadata) {
  if (metadata === null || typeof metadata !== 'object' || Array.isArray(metadata)) {
    throw `${METADATA_KEY} must be an object of strings`;
  }
  for (const [key, value] of Object.entries(metadata)) {
    if (typeof value !== 'string') {
      throw `${METADATA_KEY}.${key} must be a string, not ${JSON.stringify(value)}`;
    }
  }
}

function isCount(value) {
  return Number.isSafeInteger(value) && value >= 0;
}

/// A thrown problem as text: our own strings as they are, WASI errors by
/// their error code (`no-entry`, `access`, ...).
function describeProblem(problem) {
  if (typeof problem === 'string') {
    return problem;
  }
  const code = problem?.payload ?? problem;
  if (typeof code === 'string') {
    return `cannot read the file: ${code}`;
  }
  return `cannot read the file: ${problem?.message ?? String(problem)}`;
}

function toJsonNumber(big) {
  return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big.toString();
}

function sortedObject(object) {
  return Object.fromEntries(Object.entries(object).sort(([a], [b]) => a.localeCompare(b)));
}
