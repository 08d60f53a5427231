// The `{{name}}` deployer: writes a summary of the model's files to
// `summary.json` in the deployment's output directory and, when the option
// `target` names a publishing target, puts the model's files and the
// summary there.
//
// Replace `deploy` with what your deployer does; keep the rest.
//
// componentize-js binds the imports by their WIT names, with the version
// ('berth:deployer/host@0.2.0'), and expects the exported interface as an
// object named after it (`plugin`). WIT names become camelCase
// (`check-options` is `checkOptions`, `options-json` is `optionsJson`; `ref`
// stays `ref`), and u64 and s64 values are BigInts.
//
// Errors are returned by throwing a string: an Error object would abort the
// deployer instead of failing the deployment with a sentence.

import { log, progress } from 'berth:deployer/host@0.2.0';
import { Target } from 'berth:deployer/publish@0.2.0';

import { readText, writeFile } from './files.js';
import { Option, parseOptions, schema } from './options.js';

const NAME = '{{name}}';

// Every option this deployer takes: `describe` publishes them as a JSON
// Schema and `parseOptions` refuses anything else.
const OPTIONS = [
  new Option('note', 'string', 'a line of text written into the summary'),
  new Option('max_files', 'integer', 'fail when the model has more files than this', { minimum: 1 }),
  new Option('dry_run', 'boolean', 'check and report, but write nothing'),
  new Option('target', 'string', "a publishing target to put the model's files and the summary into"),
];

const SUMMARY = 'summary.json';
const CONFIG = 'config.json';

export const plugin = {
  describe() {
    return {
      description: "Writes a summary of the model's files to summary.json, and puts both into a publishing target when given one",
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
      listed.push({ path: file.path, size_bytes: Number(file.sizeBytes), sha256: file.sha256 ?? null });
      total += file.sizeBytes;
      progress(BigInt(index + 1), BigInt(files.length), file.path);
    }
    // The model's files are under request.dir (/model), read-only; files.js
    // reads them (readChunks for a large one, a piece at a time).
    const config = files.some((f) => f.path === CONFIG) ? parseJson(readText(request.dir, CONFIG), CONFIG) : null;

    let ref = `${request.outDir}/${SUMMARY}`;
    const summary = JSON.stringify({ model: request.model.name, job_id: request.model.jobId, note, config, files: listed });
    const published = [];
    let folderUrl = null;
    if (!dryRun) {
      writeFile(request.outDir, SUMMARY, summary);
      if (given.target !== undefined) {
        // The host streams each file, checks its sha256 at the destination
        // and records the put; this code never sees the target's credentials.
        const target = publishing(() => Target.open(given.target));
        const folder = `${request.model.jobId}/deploy-${request.deployId}`;
        // One call puts every file, a few at once. It throws nothing for a
        // file that fails: each result is { tag: 'ok', val: receipt } or
        // { tag: 'err', val: sentence }, in the order given.
        const puts = files.map((file) => [file.path, `${folder}/${file.path}`]);
        const failed = [];
        publishing(() => target.putModelFiles(puts)).forEach((put, i) => {
          if (put.tag === 'ok') {
            published.push(put.val.url);
          } else {
            failed.push(`${puts[i][0]}: ${put.val}`);
          }
        });
        if (failed.length > 0) {
          throw failed.join('; ');
        }
        // Bytes made here; target.putOutFile(SUMMARY, key) would put the
        // file written to /out instead.
        const bytes = new TextEncoder().encode(summary);
        ref = publishing(() => target.putBytes(`${folder}/${SUMMARY}`, bytes, 'application/json')).url;
        published.push(ref);
        // A folder key (ending in /): where the keys under it landed,
        // ending in / too.
        folderUrl = publishing(() => target.url(`${folder}/`));
      }
    }
    log('info', `${ref}: ${files.length} files, ${total} bytes`);
    const details = { files: files.length, bytes: Number(total), written: !dryRun };
    if (published.length > 0) {
      details.published = published;
      details.folder = folderUrl;
    }
    return { ref, detailsJson: JSON.stringify(details) };
  },
};

/// Runs a publishing call, turning its error into the sentence the host
/// gave (a refused call throws an object carrying it as `payload`).
function publishing(call) {
  try {
    return call();
  } catch (e) {
    throw typeof e === 'string' ? e : String(e?.payload ?? e?.message ?? e);
  }
}

function parseJson(text, path) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw `${path}: not valid JSON: ${e.message}`;
  }
}
