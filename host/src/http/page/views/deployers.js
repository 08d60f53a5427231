// The deployers: each loaded one as a card (where it comes from, who
// signed it, its grants and limits, a pushed version held for asking
// more), the plugins refused and why, and what to do when none is
// loaded. A view of its own (#/deployers) and a block of the models view.

import { api } from "../api.js";
import { h, failure, show, table } from "../dom.js";
import { duration, when } from "../format.js";
import { catalog, enter, isShown, loadCatalog } from "../state.js";

export async function deployersView() {
  const view = enter();
  try {
    await loadCatalog();
  } catch (e) {
    if (isShown(view)) show(failure(e));
    return;
  }
  if (!isShown(view)) return;
  const block = deployersBlock();
  show(block);
  view.catalog = () => fillDeployers(block);
}

/** The block as the catalog (state.js) is now; fillDeployers() redraws it. */
export function deployersBlock() {
  const block = h("section", { id: "deployers", "aria-labelledby": "deployers-title" });
  fillDeployers(block);
  return block;
}

// Where a deployer comes from: the plugins folder, or a version stored
// over the API (who pushed it, and when; the registry manifest it was
// pulled from, pinned by digest).
function origin(d) {
  if (d.origin !== "api") return "plugins folder";
  const by = d.added_by ? ` by ${d.added_by}` : "";
  const from = d.source ? `, pulled from ${d.source}` : "";
  return `stored over the API: version ${d.version}, pushed${by} ${when(d.added_at)}${from}`;
}

// The publishing targets its manifest grants: each name with where it
// publishes, or that this server does not configure it.
function targets(d) {
  if (!d.targets.length) return "none";
  return d.targets.map((t) => t.url ? `${t.name} (${t.url})` : `${t.name} (not configured on this server)`).join(", ");
}

export function fillDeployers(block) {
  const cards = catalog.deployers.map((d) =>
    h("article", { class: "card", "data-deployer": d.name },
      h("h3", {}, d.name),
      h("p", {}, d.description || h("span", { class: "muted" }, "no description")),
      h("dl", { class: "fields" },
        h("dt", {}, "Origin"), h("dd", { class: "origin" }, origin(d)),
        h("dt", {}, "Signed by"), h("dd", { class: "mono", title: "the trusted key whose signature matched its bytes" }, d.signed_by ?? "no trusted key"),
        h("dt", {}, "sha256"), h("dd", { class: "mono", title: d.sha256 }, d.sha256.slice(0, 16) + "…"),
        h("dt", {}, "WIT"), h("dd", {}, d.wit_version),
        h("dt", {}, "Code"), h("dd", { title: "baseline: compiled in seconds, optimized code follows in the background" }, d.tier),
        h("dt", {}, "Allowed hosts"), h("dd", {}, d.allowed_hosts.length ? d.allowed_hosts.join(", ") : "none"),
        h("dt", {}, "Targets"), h("dd", { class: "targets" }, targets(d)),
        h("dt", {}, "Env vars"), h("dd", { class: "mono" }, d.env.length ? d.env.join(", ") : "none"),
        h("dt", {}, "Memory"), h("dd", {}, `${d.memory_mib} MiB`),
        h("dt", {}, "Time limit"), h("dd", {}, duration(d.timeout_s * 1000)),
        h("dt", {}, "Output quota"), h("dd", {}, `${d.out_mib} MiB`))));
  const empty = catalog.deployers.length === 0 && h("p", { class: "notice", id: "no-deployers" },
    "No deployer is loaded, so nothing can be deployed. Copy a deployer (NAME.wasm, with an optional NAME.toml manifest) into the server's plugins folder (--plugins-dir, default ./plugins); berth picks it up within seconds. make plugins builds the examples.");
  const loading = catalog.loading.length > 0 && h("p", { class: "muted" }, `Still loading: ${catalog.loading.join(", ")}`);
  const rejected = catalog.rejected.length > 0 && [
    h("h3", { id: "refused-title" }, "Refused plugins"),
    table(["File", "Origin", "Reason"], catalog.rejected.map((r) =>
      h("tr", { "data-rejected": r.file },
        h("td", { class: "mono" }, r.file),
        h("td", {}, r.origin === "api" ? "stored over the API" : "plugins folder"),
        h("td", { class: "error-text wrap" }, r.reason))),
    { id: "refused" }),
  ];
  const parts = [h("h2", { id: "deployers-title" }, "Deployers"), empty, loading, h("div", { class: "cards" }, cards), rejected];
  block.replaceChildren(...parts.flat().filter(Boolean));
  for (const d of catalog.deployers.filter((d) => d.origin === "api")) {
    showHeld(block.querySelector(`article[data-deployer="${CSS.escape(d.name)}"]`), d.name);
  }
}

// A pushed version that grants more than the one served waits for an
// admin: what it adds, and the button that serves it.
async function showHeld(card, name) {
  let versions;
  try {
    versions = await api(`/v1/deployers/${encodeURIComponent(name)}/versions`);
  } catch {
    return;
  }
  const held = versions.versions.filter((v) => v.held).at(-1);
  if (!held || !card.isConnected) return;
  const error = h("span", { class: "error-text" });
  card.append(h("p", { class: "notice held" },
    `Version ${held.number} is held: it adds ${held.held.join(", ")}. `,
    h("button", {
      type: "button",
      onclick: async (event) => {
        event.target.disabled = true;
        try {
          await api(`/v1/deployers/${encodeURIComponent(name)}/approve`, { method: "POST" });
        } catch (e) {
          event.target.disabled = false;
          error.textContent = e.message;
        }
      },
    }, `Approve version ${held.number}`), " ", error));
}
