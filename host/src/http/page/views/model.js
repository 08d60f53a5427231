// One model (#/models/ID): its fields, its local copy, params and files,
// and its deployments, each row kept live from the event stream.

import { api } from "../api.js";
import { failure, h, show, table } from "../dom.js";
import { bytes, duration, known, statusBadge, when } from "../format.js";
import { enter, isShown, loadCatalog, progress } from "../state.js";
import { deployButton, deployersChanged } from "./deploy-dialog.js";
import { cancelButton, drawProgress, fillProgress, refLink } from "./deployment-parts.js";
import { storageBlock } from "./storage.js";

export async function modelView(id) {
  const view = enter();
  let model;
  let deployments;
  try {
    [model, deployments] = await Promise.all([
      api(`/v1/models/${id}`),
      api(`/v1/models/${id}/deployments`),
      loadCatalog(),
    ]);
  } catch (e) {
    if (isShown(view)) show(failure(e));
    return;
  }
  if (!isShown(view)) return;
  const fields = [
    ["Job id", model.job_id], ["Base model", known(model.base_model)], ["Size label", known(model.model_size)],
    ["Dataset", known(model.dataset)], ["Examples", known(model.num_examples)],
    ["Training steps", known(model.num_train_steps)], ["Final loss", known(model.final_loss)],
    ["Source", model.source], ["Registered", when(model.created_at)],
    ["Registered by", model.created_by ?? ""],
    ["Signature", signature(model.signature)],
  ];
  const origin = mlflowOrigin(model.params);
  if (origin) fields.push(["From MLflow", origin]);
  const body = h("tbody", { id: "deployments-body" }, deployments.deployments.map(deploymentRow));
  const upsert = (d) => {
    if (d.model_id === id) upsertRow(body, d);
  };
  show(
    h("p", {}, h("a", { href: "#/" }, "← Models")),
    h("h1", {}, model.name),
    h("div", { class: "toolbar" }, deployButton(model, upsert)),
    h("dl", { class: "fields" }, fields.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("h2", {}, "Storage"),
    storageBlock(model.id),
    h("h2", {}, "Params"),
    h("pre", {}, JSON.stringify(model.params, null, 2)),
    h("h2", {}, "Files"),
    ...picklesNote(model.files),
    table(["Path", "Size", "Format", "sha256"], model.files.map((f) =>
      h("tr", {}, h("td", { class: "wrap mono" }, f.path), h("td", { class: "num", title: `${f.size_bytes} bytes` }, bytes(f.size_bytes)), formatCell(f.format), h("td", { class: "mono wrap" }, f.sha256)))),
    h("h2", {}, "Deployments"),
    h("div", { class: "table-wrap" },
      h("table", { id: "deployments" },
        h("thead", {}, h("tr", {},
          ["Id", "Status", "Phase", "Deployer", "Ref", "Duration", "Created", "By", "Error", ""].map((t, i) =>
            h("th", { scope: "col", class: [6, 7].includes(i) ? "hide-narrow" : undefined }, t)))),
        body)),
  );
  view.deployment = upsert;
  view.progress = (event) => {
    const row = body.querySelector(`tr[data-deployment="${event.deploy_id}"]`);
    const cell = row?.querySelector(".progress-cell");
    if (cell && row.dataset.status === "running") fillProgress(cell, event.phase, event.progress);
  };
  view.catalog = deployersChanged;
}

function deploymentRow(d) {
  const running = d.status === "running";
  const open = running || d.status === "queued";
  const progressCell = h("td", { class: "progress-cell" });
  if (running) drawProgress(progressCell, d);
  else progress.delete(d.id);
  return h("tr", { "data-deployment": d.id, "data-status": d.status },
    h("td", {}, h("a", { href: `#/deployments/${d.id}` }, `#${d.id}`)),
    h("td", { class: "status-cell" }, statusBadge(d.status)),
    progressCell,
    h("td", {}, d.deployer),
    h("td", { class: "wrap mono ref-cell" }, refLink(d)),
    h("td", { class: "num duration-cell" }, duration(d.duration_ms)),
    h("td", { class: "hide-narrow" }, when(d.created_at)),
    h("td", { class: "hide-narrow cause-cell" }, cause(d)),
    h("td", { class: "error-text wrap error-cell" }, d.error ?? ""),
    h("td", {}, open && cancelButton(d.id)));
}

/** Who asked: a token's name, or the rule and the deployment whose
 * completion fired it, so the rows read as the model's chain. */
function cause(d) {
  if (!d.cause) return d.created_by ?? "";
  const after = d.cause.previous_deployment_id;
  return after ? `rule ${d.cause.rule}, after #${after}` : `rule ${d.cause.rule}, at registration`;
}

/** A deployment's row, replaced or added on top; the focus stays on it. */
function upsertRow(body, d) {
  const row = deploymentRow(d);
  const old = body.querySelector(`tr[data-deployment="${d.id}"]`);
  const focused = old?.contains(document.activeElement);
  if (old) old.replaceWith(row);
  else body.prepend(row);
  if (focused) row.querySelector("a")?.focus();
}

// A pickle runs code when loaded: marked, and said once above the files.
const isPickle = (format) => format === "pickle" || format === "zip-pickle";

// The format a fetch told from the file's bytes; unknown until one has.
function formatCell(format) {
  if (format == null) return h("td", { class: "format", title: "not fetched yet" }, "—");
  return isPickle(format)
    ? h("td", { class: "format pickle", title: "a pickle: loading it runs code" }, format)
    : h("td", { class: "format" }, format);
}

// Nodes to spread into the view: none without pickles.
function picklesNote(files) {
  const pickles = files.filter((f) => isPickle(f.format)).map((f) => f.path);
  if (pickles.length === 0) return [];
  return [h("p", { class: "pickles-note" },
    `${pickles.length === 1 ? "1 file is a pickle" : `${pickles.length} files are pickles`} (loading runs code): ${pickles.join(", ")}`)];
}

// Where a model registered from MLflow came from (its params' mlflow_*):
// name, version, the alias it was found by, and a link to its run's page
// (only an http(s) URL is made a link; the run page is MLflow's UI).
function mlflowOrigin(params) {
  if (!params || typeof params.mlflow_name !== "string") return null;
  const alias = params.mlflow_alias ? ` (alias ${params.mlflow_alias})` : "";
  const text = `${params.mlflow_name} version ${params.mlflow_version}${alias}`;
  const run = params.mlflow_run_url;
  if (typeof run !== "string" || !/^https?:\/\//.test(run)) return text;
  return h("span", {}, `${text}, `,
    h("a", { href: run, rel: "noopener noreferrer", target: "_blank" }, `run ${params.mlflow_run_id ?? ""}`));
}

// What the model's signature says, in a line (see the API's ModelSignature).
function signature(sig) {
  if (!sig) return "none";
  if (sig.verified) return `verified: ${sig.signer} (${when(sig.verified_at)})`;
  return `not verified: ${sig.error}`;
}
