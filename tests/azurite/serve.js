// An Azure Blob Storage emulator for berth's tests and benchmarks.
//
// Azurite (npm `azurite`, pinned in package.json beside this file and
// installed by `scripts/setup test`), its blob service alone on a free
// loopback port, keeping its data in a temporary folder, with the containers
// named on the command line, created under its well-known development
// account. Prints one JSON line (the account's endpoint, name and key), then
// serves until its standard input closes, which happens when the process
// that started it exits, however it exits; then it is stopped and its folder
// removed.
//
//     node tests/azurite/serve.js CONTAINER...
"use strict";

const { spawn } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

// Azurite's development account, the same in every installation.
const ACCOUNT = "devstoreaccount1";
const KEY =
  "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "berth-azurite-"));
const server = spawn(
  process.execPath,
  [
    path.join(__dirname, "node_modules/azurite/dist/src/blob/main.js"),
    "--blobHost", "127.0.0.1",
    "--blobPort", "0",
    "--location", root,
    "--silent",
  ],
  { stdio: ["ignore", "pipe", "inherit"] },
);

function stop() {
  server.kill("SIGKILL");
  fs.rmSync(root, { recursive: true, force: true });
}
process.stdin.on("end", () => {
  stop();
  process.exit(0);
});
process.stdin.resume();
server.on("exit", (code) => {
  fs.rmSync(root, { recursive: true, force: true });
  console.error(`azurite exited (${code})`);
  process.exit(1);
});

// "Azurite Blob service successfully listens on http://127.0.0.1:PORT"
let said = "";
server.stdout.on("data", async (chunk) => {
  said += chunk;
  const found = said.match(/listens on (http:\/\/\S+)/);
  if (!found) return;
  server.stdout.removeAllListeners("data");
  server.stdout.resume();
  const endpoint = `${found[1]}/${ACCOUNT}`;
  try {
    for (const container of process.argv.slice(2)) {
      await createContainer(endpoint, container);
    }
  } catch (e) {
    console.error(`azurite: cannot create the containers: ${e.message}`);
    stop();
    process.exit(1);
  }
  process.stdout.write(JSON.stringify({ endpoint, account: ACCOUNT, key: KEY }) + "\n");
});

// Create Container, signed with the account key (Shared Key), as any
// client does.
async function createContainer(endpoint, container) {
  const url = `${endpoint}/${container}?restype=container`;
  const date = new Date().toUTCString();
  const version = "2021-08-06";
  const toSign = [
    // An empty body's length is signed as nothing, not 0.
    "PUT", "", "", "", "", "", "", "", "", "", "", "",
    `x-ms-date:${date}\nx-ms-version:${version}`,
    `/${ACCOUNT}/${ACCOUNT}/${container}\nrestype:container`,
  ].join("\n");
  const signature = crypto
    .createHmac("sha256", Buffer.from(KEY, "base64"))
    .update(toSign, "utf8")
    .digest("base64");
  const answer = await fetch(url, {
    method: "PUT",
    headers: {
      "x-ms-date": date,
      "x-ms-version": version,
      "Content-Length": "0",
      Authorization: `SharedKey ${ACCOUNT}:${signature}`,
    },
  });
  if (answer.status !== 201) {
    throw new Error(`${container}: ${answer.status} ${await answer.text()}`);
  }
}
