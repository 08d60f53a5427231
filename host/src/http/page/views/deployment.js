// One deployment (#/deployments/ID): its record, options, details,
// artifacts, what it published and its logs; drawn again when it changes.

import { api } from "../api.js";
import { failure, h, show, table } from "../dom.js";
import { bytes, duration, statusBadge, when } from "../format.js";
import { enter, isShown } from "../state.js";
import { artifactLink, cancelButton, drawProgress, fillProgress, refLink } from "./deployment-parts.js";

export async function deploymentView(id) {
  const view = enter();
  let d;
  let logs;
  let files;
  try {
    [d, logs, files] = await Promise.all([
      api(`/v1/deployments/${id}`),
      api(`/v1/deployments/${id}/logs`),
      api(`/v1/deployments/${id}/files`),
    ]);
  } catch (e) {
    if (isShown(view)) show(failure(e));
    return;
  }
  if (!isShown(view)) return;
  const progressCell = h("span", { id: "deployment-progress" });
  if (d.status === "running") drawProgress(progressCell, d);
  show(
    h("p", {}, h("a", { href: `#/models/${d.model_id}` }, "← Model")),
    h("h1", {}, `Deployment #${d.id}`),
    h("dl", { class: "fields", id: "deployment-fields" },
      h("dt", {}, "Status"), h("dd", {}, statusBadge(d.status), " ", progressCell),
      h("dt", {}, "Deployer"), h("dd", {}, d.deployer),
      h("dt", {}, "Plugin sha256"), h("dd", { class: "mono", title: "the version of the deployer that ran it" }, d.plugin_sha256),
      h("dt", {}, "Ref"), h("dd", { class: "mono" }, refLink(d)),
      h("dt", {}, "Duration"), h("dd", {}, duration(d.duration_ms)),
      h("dt", {}, "Created"), h("dd", {}, when(d.created_at)),
      h("dt", {}, "Started"), h("dd", {}, when(d.started_at)),
      h("dt", {}, "Server"), h("dd", { class: "mono" }, d.server ?? ""),
      h("dt", {}, "Completed"), h("dd", {}, when(d.completed_at)),
      h("dt", {}, "Created by"), h("dd", {}, d.created_by ?? ""),
      h("dt", {}, "Error"), h("dd", { class: "error-text" }, d.error ?? ""),
      h("dt", {}, "Model files"), h("dd", { class: "mono" }, d.dir),
      h("dt", {}, "Output directory"), h("dd", { class: "mono" }, d.out_dir)),
    (d.status === "running" || d.status === "queued") && h("div", { class: "actions" }, cancelButton(d.id)),
    h("h2", {}, "Options"),
    h("pre", {}, JSON.stringify(d.options, null, 2)),
    h("h2", {}, "Details"),
    h("pre", { id: "details" }, JSON.stringify(d.details, null, 2)),
    h("h2", {}, "Artifacts"),
    files.files.length
      ? table(["Path", "Size", "Modified"], files.files.map((f) =>
        h("tr", {}, h("td", { class: "wrap mono" }, artifactLink(d.id, f.path)), h("td", { class: "num", title: `${f.size_bytes} bytes` }, bytes(f.size_bytes)), h("td", {}, when(f.modified)))),
      { id: "artifacts" })
      : h("p", { class: "muted" }, "The deployer wrote no files."),
    files.truncated && h("p", { class: "muted" }, "Only the first 10,000 files are listed."),
    h("h2", {}, "Published"),
    d.published.length
      ? table(["Target", "Key", "Size", "sha256", "Where"], d.published.map((p) =>
        h("tr", {}, h("td", {}, p.target), h("td", { class: "wrap mono" }, p.key), h("td", { class: "num", title: `${p.bytes} bytes` }, bytes(p.bytes)), h("td", { class: "mono", title: p.sha256 }, p.sha256.slice(0, 12)), h("td", { class: "wrap mono" }, p.url))),
      { id: "published" })
      : h("p", { class: "muted" }, "The deployer published nothing."),
    h("h2", {}, "Logs"),
    h("pre", { id: "logs" }, typeof logs === "string" && logs ? logs : "(nothing logged)"),
  );
  view.deployment = (changed) => {
    if (changed.id === id) deploymentView(id);
  };
  view.progress = (event) => {
    if (event.deploy_id === id) fillProgress(progressCell, event.phase, event.progress);
  };
}
