// Files in the sandbox, through the world's wasi:filesystem imports:
// JavaScript has no file API here. `readChunks` reads a model file a piece
// at a time (never the whole file in memory), `readText` a small file
// whole, `writeFile` writes into the out-dir. Problems are thrown as
// sentences (strings), so they fail the deployment with that sentence.

import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

/// What one read asks for by default: few reads, and little memory.
const CHUNK_BYTES = 1 << 20;

/// Yields the file `path` under the mounted directory `guestDir` (`/model`)
/// as Uint8Arrays of at most `chunkBytes`, in order:
///
///     for (const chunk of readChunks(request.dir, file.path)) { ... }
///
/// Breaking out of the loop closes the file.
export function* readChunks(guestDir, path, chunkBytes = CHUNK_BYTES) {
  const file = attempt(`${guestDir}/${path}: cannot open it`, () =>
    preopen(guestDir).openAt({ symlinkFollow: false }, path, {}, { read: true }));
  try {
    let offset = 0n;
    for (;;) {
      const [chunk, eof] = attempt(`${guestDir}/${path}: cannot read it`, () =>
        file.read(BigInt(chunkBytes), offset));
      if (chunk.length > 0) {
        offset += BigInt(chunk.length);
        yield chunk;
      }
      if (eof || chunk.length === 0) {
        return;
      }
    }
  } finally {
    file[Symbol.dispose]?.();
  }
}

/// The file `path` under `guestDir` as UTF-8 text; refuses one larger than
/// `maxBytes` rather than holding it all.
export function readText(guestDir, path, maxBytes = CHUNK_BYTES) {
  const chunks = [];
  let length = 0;
  for (const chunk of readChunks(guestDir, path)) {
    length += chunk.length;
    if (length > maxBytes) {
      throw `${guestDir}/${path}: larger than ${maxBytes} bytes; read it with readChunks`;
    }
    chunks.push(chunk);
  }
  const bytes = new Uint8Array(length);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return new TextDecoder().decode(bytes);
}

/// Writes `bytes` (a Uint8Array or a string) to `name` in the mounted
/// directory `guestDir` (`/out`).
export function writeFile(guestDir, name, bytes) {
  const data = typeof bytes === 'string' ? new TextEncoder().encode(bytes) : bytes;
  attempt(`${guestDir}/${name}: cannot write it`, () => {
    const file = preopen(guestDir).openAt({}, name, { create: true, truncate: true }, { write: true });
    try {
      let written = 0;
      while (written < data.length) {
        written += Number(file.write(data.subarray(written), BigInt(written)));
      }
    } finally {
      file[Symbol.dispose]?.();
    }
  });
}

function preopen(guestDir) {
  const found = getDirectories().find(([, path]) => path === guestDir);
  if (!found) {
    throw `${guestDir} is not mounted in this sandbox`;
  }
  return found[0];
}

/// Runs `work`, turning what it throws into a sentence that starts with
/// `what`: WASI errors are objects carrying an error code (`no-entry`).
function attempt(what, work) {
  try {
    return work();
  } catch (e) {
    throw typeof e === 'string' ? e : `${what}: ${e?.payload ?? e?.message ?? e}`;
  }
}
