// The `{{name}}` deployer: writes a summary of the model's files to
// `summary.json` in the deployment's output directory.
//
// Replace `deploy` with what your deployer does; keep the rest.
//
// componentize-js binds the imports by their WIT names, with the version
// ('berth:deployer/host@0.1.0'), and expects the exported interface as an
// object named after it (`plugin`). WIT names become camelCase
// (`check-options` is `checkOptions`, `options-json` is `optionsJson`; `ref`
// stays `ref`), and u64 values are BigInts.
//
// Errors are returned by throwing a string: an Error object would abort the
// deployer instead of failing the deployment with a sentence.

import { log, progress } from 'berth:deployer/host@0.1.0';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

import { Option, parseOptions, schema } from './options.js';

const NAME = '{{name}}';

// Every option this deployer takes: `describe` publishes them as a JSON
// Schema and `parseOptions` refuses anything else.
const OPTIONS = [
  new Option('note', 'string', 'a line of text written into the summary'),
  new Option('max_files', 'integer', 'fail when the model has more files than this', { minimum: 1 }),
  new Option('dry_run', 'boolean', 'check and report, but write nothing'),
];

const SUMMARY = 'summary.json';

export const plugin = {
  describe() {
    return {
      description: "Writes a summary of the model's files to summary.json in the deployment's output directory",
      optionsSchema: schema(OPTIONS),
    };
  },

  // Called before anything is fetched: refuse bad options early.
  checkOptions(optionsJson) {
    parseOptions(NAME, OPTIONS, optionsJson);
  },

  deploy(request) {
    const given = parseOptions(NAME, OPTIONS, request.optionsJson);
    const note = given.note ?? '';
    const dryRun = given.dry_run ?? false;
    const files = request.model.files;
    if (given.max_files !== undefined && files.length > given.max_files) {
      throw `the model has ${files.length} files, more than max_files (${given.max_files})`;
    }

    const listed = [];
    let total = 0n;
    for (const [index, file] of files.entries()) {
      // The model's files are under request.dir (/model), read-only: JavaScript
      // has no file API here, so read them like writeFile below writes.
      listed.push({ path: file.path, size_bytes: Number(file.sizeBytes), sha256: file.sha256 ?? null });
      total += file.sizeBytes;
      progress(BigInt(index + 1), BigInt(files.length), file.path);
    }

    const path = `${request.outDir}/${SUMMARY}`;
    if (!dryRun) {
      const summary = { model: request.model.name, job_id: request.model.jobId, note, files: listed };
      writeFile(request.outDir, SUMMARY, JSON.stringify(summary));
    }
    log('info', `${path}: ${files.length} files, ${total} bytes`);
    return {
      ref: path,
      detailsJson: JSON.stringify({ files: files.length, bytes: Number(total), written: !dryRun }),
    };
  },
};

/// Writes `text` to `name` in the preopened directory `guestDir` (`/out`),
/// through the world's wasi:filesystem imports.
function writeFile(guestDir, name, text) {
  const found = getDirectories().find(([, path]) => path === guestDir);
  if (!found) {
    throw `${guestDir} is not mounted in this sandbox`;
  }
  const bytes = new TextEncoder().encode(text);
  try {
    const file = found[0].openAt({}, name, { create: true, truncate: true }, { write: true });
    let written = 0;
    while (written < bytes.length) {
      written += Number(file.write(bytes.subarray(written), BigInt(written)));
    }
  } catch (e) {
    // WASI errors are thrown as objects carrying an error code.
    throw `${guestDir}/${name}: cannot write the summary: ${typeof e === 'string' ? e : e?.payload ?? e}`;
  }
}
