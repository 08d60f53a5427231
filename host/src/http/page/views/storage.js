// The models dir's use of disk (GET /v1/storage): a line on the models
// view, a block on a model's view. Each is drawn at once and filled when
// the scan answers, so a slow disk never holds up the view.

import { api } from "../api.js";
import { h } from "../dom.js";
import { bytes, when } from "../format.js";

/** "On disk 3.0 GiB · saved by sharing 1.0 GiB · budget 10.0 GiB". */
export function storageLine() {
  const line = h("p", { id: "storage-line", class: "muted" }, "Storage: …");
  load(line, (storage) => {
    const parts = [
      `On disk ${bytes(storage.bytes_on_disk)}`,
      `saved by sharing ${bytes(storage.bytes_saved)}`,
    ];
    if (storage.budget_bytes !== null) parts.push(`budget ${bytes(storage.budget_bytes)}`);
    if (storage.pinned_blobs) {
      parts.push(`pinned by upload ${bytes(storage.pinned_bytes)} (${storage.pinned_blobs} blobs)`);
    }
    if (storage.unreferenced_blob_bytes) {
      parts.push(`${bytes(storage.unreferenced_blob_bytes)} in blobs no model links`);
    }
    line.replaceChildren(`Storage (${storage.models_dir}): ${parts.join(" · ")}`);
    line.title = `${storage.bytes_on_disk} bytes on disk`;
  });
  return line;
}

/** The model's local copy: whether it is whole, its bytes, the part it
 * shares with other models, when it was last deployed. */
export function storageBlock(modelId) {
  const block = h("dl", { id: "model-storage", class: "fields" },
    h("dt", {}, "Local copy"), h("dd", {}, "…"));
  load(block, (storage) => {
    const mine = storage.models.find((m) => m.id === modelId);
    if (!mine) return;
    const rows = [
      ["Local copy", mine.local ? "yes: deploys without fetching" : "no: fetched on its next deployment"],
      ["On disk", bytes(mine.bytes)],
      ["Shared with other models", bytes(mine.shared_bytes)],
      ["Last deployed", mine.last_deployed ? when(mine.last_deployed) : "never"],
    ];
    block.dataset.local = String(mine.local);
    block.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  });
  return block;
}

async function load(element, fill) {
  try {
    fill(await api("/v1/storage"));
  } catch (e) {
    element.replaceChildren(h("span", { class: "error-text" }, `Storage: ${e.message}`));
  }
}
