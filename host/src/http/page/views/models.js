// The models view (#/): every model, newest first, with a filter, each
// model's newest deployment and a Deploy button, and the storage line;
// below it the register form and the deployers.

import { api } from "../api.js";
import { failure, h, show } from "../dom.js";
import { bytes, statusBadge } from "../format.js";
import { enter, isShown, loadCatalog } from "../state.js";
import { deployButton, deployersChanged } from "./deploy-dialog.js";
import { deployersBlock, fillDeployers } from "./deployers.js";
import { registerForm } from "./register.js";
import { storageLine } from "./storage.js";

/** What the filter box holds, kept while the visitor looks elsewhere. */
let filter = "";
/** model id → its newest deployment (null: none), kept so that a view
 * drawn again shows the last one known until it is read anew. */
const newest = new Map();

export async function modelsView() {
  const view = enter();
  let models;
  try {
    [{ models }] = await Promise.all([api("/v1/models"), loadCatalog()]);
  } catch (e) {
    if (isShown(view)) show(failure(e));
    return;
  }
  if (!isShown(view)) return;
  const body = h("tbody", {});
  const renderRows = () => {
    const rows = filtered(models).map(modelRow);
    body.replaceChildren(...(rows.length
      ? rows
      : [h("tr", {}, h("td", { colspan: 8, class: "muted" },
        models.length ? "No model matches the filter." : "No model is registered yet."))]));
  };
  renderRows();
  const search = h("input", {
    type: "search",
    placeholder: "Filter by name, job id, base model…",
    "aria-label": "Filter models",
    value: filter,
    oninput: (e) => {
      filter = e.target.value;
      renderRows();
    },
  });
  const deployers = deployersBlock();
  show(
    h("h1", {}, "Models"),
    storageLine(),
    h("div", { class: "toolbar" }, search),
    h("div", { class: "table-wrap" },
      h("table", { id: "models" },
        h("thead", {}, h("tr", {},
          ["Name", "Job id", "Base model", "Size", "Files", "Total", "Newest deployment", ""].map((t, i) =>
            h("th", { scope: "col", class: [2, 3, 4].includes(i) ? "hide-narrow" : undefined }, t)))),
        body)),
    registerForm(() => modelsView()),
    deployers,
  );
  view.deployment = (d) => setNewest(d.model_id, d);
  view.catalog = () => {
    fillDeployers(deployers);
    deployersChanged();
  };
  // For scripts/measure-page and DevTools: when the table was drawn.
  performance.mark("berth:models-drawn");
  loadNewest(models);
}

function setNewest(modelId, deployment) {
  newest.set(modelId, deployment);
  document.getElementById(`newest-${modelId}`)?.replaceChildren(newestCell(modelId));
}

/** Newest deployment of each model, a few requests at a time. */
async function loadNewest(models) {
  const queue = [...models];
  const worker = async () => {
    while (queue.length) {
      const model = queue.shift();
      try {
        const body = await api(`/v1/models/${model.id}/deployments?limit=1`);
        setNewest(model.id, body.deployments[0] ?? null);
      } catch {
        // Deleted meanwhile: the cell stays empty.
      }
    }
  };
  await Promise.all(Array.from({ length: 6 }, worker));
}

function newestCell(modelId) {
  const d = newest.get(modelId);
  if (d === undefined) return h("span", { class: "muted" }, "…");
  if (d === null) return h("span", { class: "muted" }, "never deployed");
  return h("a", { href: `#/deployments/${d.id}` }, statusBadge(d.status));
}

function modelRow(model) {
  const total = model.files.reduce((sum, f) => sum + f.size_bytes, 0);
  return h("tr", { "data-model": model.id },
    h("td", { class: "wrap" }, h("a", { href: `#/models/${model.id}` }, model.name)),
    h("td", { class: "wrap mono" }, model.job_id),
    h("td", { class: "wrap hide-narrow" }, model.base_model ?? ""),
    h("td", { class: "hide-narrow" }, model.model_size),
    h("td", { class: "num hide-narrow" }, model.files.length),
    h("td", { class: "num", title: `${total} bytes` }, bytes(total)),
    h("td", { id: `newest-${model.id}` }, newestCell(model.id)),
    h("td", {}, deployButton(model, () => {
      location.hash = `#/models/${model.id}`;
    })));
}

/** The models whose text holds every word of the filter, newest first. */
function filtered(models) {
  const words = filter.toLowerCase().split(/\s+/).filter(Boolean);
  const newestFirst = [...models].sort((a, b) => b.id - a.id);
  if (!words.length) return newestFirst;
  return newestFirst.filter((m) => {
    const text = [m.name, m.job_id, m.base_model, m.model_size, m.dataset].join(" ").toLowerCase();
    return words.every((w) => text.includes(w));
  });
}
