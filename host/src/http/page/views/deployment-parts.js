// What the model view's rows and the deployment view both draw of a
// deployment: its progress, its ref (a link when it is an artifact),
// artifact links that carry the token, and the Cancel button.

import { api, authHeaders } from "../api.js";
import { h } from "../dom.js";
import { bytes } from "../format.js";
import { progress, tell } from "../state.js";
import { token } from "../token.js";

/** The progress of a running deployment `d` into `cell`: the latest event
 * heard if any, else what its record says. */
export function drawProgress(cell, d) {
  const live = progress.get(d.id);
  fillProgress(cell, live?.phase ?? d.phase, live?.progress ?? d.progress);
}

export function fillProgress(cell, phase, p) {
  if (!p) return cell.replaceChildren(phase ?? "");
  // Fetching: bytes of the model's files; deploying: the deployer's own
  // figures if it reports any (otherwise a bar without an end).
  let value;
  let max;
  let note = "";
  if (phase === "deploying") {
    if (p.deployer?.total) {
      value = p.deployer.done;
      max = p.deployer.total;
    }
    note = p.deployer?.note ?? "";
    if (p.published?.bytes) note = `${note}${note ? "; " : ""}published ${bytes(p.published.bytes)} in ${p.published.files} files`;
  } else if (p.bytes_total) {
    value = p.bytes_done;
    max = p.bytes_total;
    note = `${bytes(p.bytes_done)} of ${bytes(p.bytes_total)}`;
  }
  const bar = max
    ? h("progress", { value, max, "aria-label": `${phase ?? "progress"} ${Math.round((100 * value) / max)}%` })
    : h("progress", { "aria-label": phase ?? "running" });
  cell.replaceChildren(h("span", { class: "phase" }, phase ?? "starting"), " ", bar, note && h("span", { class: "help" }, ` ${note}`));
}

/** A ref under /out is an artifact: link it. */
export function refLink(d) {
  if (!d.ref) return "";
  if (d.ref.startsWith("/out/")) {
    const path = d.ref.slice("/out/".length);
    return artifactLink(d.id, path, d.ref);
  }
  return d.ref;
}

function artifactUrl(id, path) {
  return `/v1/deployments/${id}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

export function artifactLink(id, path, label = path) {
  const url = artifactUrl(id, path);
  return h("a", {
    href: url,
    download: path.split("/").pop(),
    onclick: (event) => {
      // A link cannot carry the token: fetch with it and hand over the bytes.
      if (!token()) return;
      event.preventDefault();
      download(url, path.split("/").pop());
    },
  }, label);
}

async function download(url, name) {
  const response = await fetch(url, { headers: authHeaders() });
  if (!response.ok) return alert(`Download failed: ${response.status}`);
  const blob = await response.blob();
  const link = h("a", { href: URL.createObjectURL(blob), download: name });
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
}

/** Cancels deployment `id`; the shown view hears of the answer as of any
 * other change. */
export function cancelButton(id) {
  return h("button", {
    type: "button",
    class: "cancel",
    "aria-label": `Cancel deployment ${id}`,
    onclick: async (event) => {
      const button = event.target;
      button.disabled = true;
      try {
        tell("deployment", await api(`/v1/deployments/${id}/cancel`, { method: "POST" }));
      } catch (e) {
        button.disabled = false;
        button.title = e.message;
      }
    },
  }, "Cancel");
}
