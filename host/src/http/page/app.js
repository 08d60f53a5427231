// berth's admin page: every figure comes from /v1 with the visitor's token;
// live changes come from /v1/events, read with fetch() (EventSource cannot
// send a header, and a token never goes into a URL). Text is always set
// with textContent: names, errors and logs are written by others.

const TOKEN_KEY = "berth-token";
const main = document.getElementById("main");
const streamBadge = document.getElementById("stream");

const state = {
  models: [],
  /** model id → its newest deployment (or null: none) */
  newest: new Map(),
  deployers: [],
  rejected: [],
  loading: [],
  filter: "",
  /** deployment id → its latest progress event, newer than any row read
   * before it: a row fetched after a `started` event may arrive late. */
  live: new Map(),
  /** what the current view shows, to update it from events */
  view: { kind: "models" },
};

// ---- HTTP ----------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path, { method = "GET", body } = {}) {
  const headers = authHeaders();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {
    // Plain text: logs.
  }
  if (response.status === 401) askToken(data?.error);
  if (!response.ok) {
    throw new ApiError(response.status, data?.error ?? `${response.status} ${response.statusText}`);
  }
  return data;
}

// ---- small DOM helpers ---------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function table(headers, rows, attrs = {}) {
  return h("div", { class: "table-wrap" },
    h("table", attrs,
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** As berth writes durations for people: 850ms, 12.3s, 1m 30s, 2h 1m. */
// As the server writes durations (human::duration): 850ms, 12.3s, 45s,
// 1m 30s, 30m, 2h, 2h 1m.
function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${ms}ms`;
  const s = Math.floor(ms / 1000);
  const [h, m, sec] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  if (h === 0 && m === 0) {
    return ms % 1000 === 0 ? `${sec}s` : `${sec}.${Math.floor((ms % 1000) / 100)}s`;
  }
  if (h === 0) return sec === 0 ? `${m}m` : `${m}m ${sec}s`;
  return m === 0 ? `${h}h` : `${h}h ${m}m`;
}

function when(text) {
  if (!text) return "";
  const date = new Date(text);
  return Number.isNaN(date.getTime()) ? text : date.toLocaleString();
}

function statusBadge(status) {
  return h("span", { class: `status ${status}`, "data-status": status }, status);
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

/** Tab and Shift+Tab cycle inside an open dialog, never leave it. */
function trapFocus(dialog) {
  dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Tab") return;
    const focusable = [...dialog.querySelectorAll("button, input, select, textarea, a[href]")]
      .filter((el) => !el.disabled && el.offsetParent !== null);
    if (!focusable.length) return;
    const first = focusable[0];
    const last = focusable[focusable.length - 1];
    if (event.shiftKey && document.activeElement === first) {
      event.preventDefault();
      last.focus();
    } else if (!event.shiftKey && document.activeElement === last) {
      event.preventDefault();
      first.focus();
    }
  });
}

// ---- token ---------------------------------------------------------------

const tokenDialog = document.getElementById("token-dialog");
const tokenInput = document.getElementById("token-input");
trapFocus(tokenDialog);

function askToken(reason) {
  if (tokenDialog.open) return;
  document.getElementById("token-why").textContent =
    (reason ? `${reason}. ` : "") +
    "The token is kept in this tab only (sessionStorage) and sent as Authorization: Bearer.";
  tokenInput.value = "";
  tokenDialog.showModal();
}

tokenDialog.addEventListener("close", () => {
  if (tokenDialog.returnValue === "save" && tokenInput.value.trim()) {
    sessionStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
  } else if (tokenDialog.returnValue === "forget") {
    sessionStorage.removeItem(TOKEN_KEY);
  } else {
    return;
  }
  restartStream();
  route();
});
document.getElementById("token-button").addEventListener("click", () => askToken());

// ---- data ----------------------------------------------------------------

async function loadDeployers() {
  const body = await api("/v1/deployers");
  state.deployers = body.deployers;
  state.rejected = body.rejected;
  state.loading = body.loading ?? [];
}

/** Newest deployment of each model, a few requests at a time. */
async function loadNewest(models) {
  const queue = [...models];
  const worker = async () => {
    while (queue.length) {
      const model = queue.shift();
      try {
        const body = await api(`/v1/models/${model.id}/deployments?limit=1`);
        state.newest.set(model.id, body.deployments[0] ?? null);
        const cell = document.getElementById(`newest-${model.id}`);
        if (cell) cell.replaceChildren(newestCell(model.id));
      } catch {
        // Deleted meanwhile: the cell stays empty.
      }
    }
  };
  await Promise.all(Array.from({ length: 6 }, worker));
}

// ---- views ---------------------------------------------------------------

function route() {
  const hash = location.hash || "#/";
  let match;
  if ((match = hash.match(/^#\/models\/(\d+)$/))) return modelView(Number(match[1]));
  if ((match = hash.match(/^#\/deployments\/(\d+)$/))) return deploymentView(Number(match[1]));
  if (hash === "#/deployers") return deployersView();
  return modelsView();
}

window.addEventListener("hashchange", () => {
  route();
  main.focus({ preventScroll: true });
});

function failure(error) {
  return h("p", { class: "error-text", role: "alert" }, error.message);
}

function newestCell(modelId) {
  const newest = state.newest.get(modelId);
  if (newest === undefined) return h("span", { class: "muted" }, "…");
  if (newest === null) return h("span", { class: "muted" }, "never deployed");
  return h("a", { href: `#/deployments/${newest.id}` }, statusBadge(newest.status));
}

function modelRow(model) {
  const total = model.files.reduce((sum, f) => sum + f.size_bytes, 0);
  return h("tr", { "data-model": model.id },
    h("td", { class: "wrap" }, h("a", { href: `#/models/${model.id}` }, model.name)),
    h("td", { class: "wrap mono" }, model.job_id),
    h("td", { class: "wrap hide-narrow" }, model.base_model),
    h("td", { class: "hide-narrow" }, model.model_size),
    h("td", { class: "num hide-narrow" }, model.files.length),
    h("td", { class: "num", title: `${total} bytes` }, bytes(total)),
    h("td", { id: `newest-${model.id}` }, newestCell(model.id)),
    h("td", {}, deployButton(model)));
}

function deployButton(model) {
  const none = state.deployers.length === 0;
  return h("button", {
    type: "button",
    class: "primary",
    disabled: none,
    title: none ? "no deployer is loaded" : undefined,
    "aria-label": `Deploy ${model.name}`,
    onclick: () => openDeploy(model),
  }, "Deploy");
}

function filtered() {
  const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
  const newestFirst = [...state.models].sort((a, b) => b.id - a.id);
  if (!words.length) return newestFirst;
  return newestFirst.filter((m) => {
    const text = [m.name, m.job_id, m.base_model, m.model_size, m.dataset].join(" ").toLowerCase();
    return words.every((w) => text.includes(w));
  });
}

async function modelsView() {
  state.view = { kind: "models" };
  const [models] = await Promise.all([api("/v1/models"), loadDeployers()]).catch((e) => {
    show(failure(e));
    return [];
  });
  if (!models || state.view.kind !== "models") return;
  state.models = models.models;
  const body = h("tbody", {});
  const renderRows = () => {
    const rows = filtered().map(modelRow);
    body.replaceChildren(...(rows.length
      ? rows
      : [h("tr", {}, h("td", { colspan: 8, class: "muted" },
        state.models.length ? "No model matches the filter." : "No model is registered yet."))]));
  };
  renderRows();
  const filter = h("input", {
    type: "search",
    placeholder: "Filter by name, job id, base model…",
    "aria-label": "Filter models",
    value: state.filter,
    oninput: (e) => {
      state.filter = e.target.value;
      renderRows();
    },
  });
  show(
    h("h1", {}, "Models"),
    h("div", { class: "toolbar" }, filter),
    h("div", { class: "table-wrap" },
      h("table", { id: "models" },
        h("thead", {}, h("tr", {},
          ["Name", "Job id", "Base model", "Size", "Files", "Total", "Newest deployment", ""].map((t, i) =>
            h("th", { scope: "col", class: [2, 3, 4].includes(i) ? "hide-narrow" : undefined }, t)))),
        body)),
    registerForm(),
    deployersBlock(),
  );
  // For scripts/measure-page and DevTools: when the table was drawn.
  performance.mark("berth:models-drawn");
  loadNewest(state.models);
}

// ---- register ------------------------------------------------------------

const REGISTER_FIELDS = [
  ["name", "Name", "text", true],
  ["job_id", "Job id", "text", true],
  ["base_model", "Base model", "text"],
  ["model_size", "Size label", "text"],
  ["dataset", "Dataset", "text"],
  ["num_examples", "Examples", "number"],
  ["num_train_steps", "Training steps", "number"],
  ["final_loss", "Final loss", "number"],
  ["source", "Source URL template", "text", true, "e.g. https://hub.internal/models/{job_id}/{path}"],
];

function registerForm() {
  const inputs = {};
  const problems = {};
  const fieldBox = (name, label, control, help) => {
    problems[name] = h("span", { class: "problem", id: `reg-${name}-problem`, "aria-live": "polite" });
    control.id = `reg-${name}`;
    control.name = name;
    control.setAttribute("aria-describedby", `reg-${name}-problem${help ? ` reg-${name}-help` : ""}`);
    inputs[name] = control;
    return h("div", { class: "field", "data-field": name },
      h("label", { for: control.id }, label),
      control,
      help && h("span", { class: "help", id: `reg-${name}-help` }, help),
      problems[name]);
  };
  const grid = h("div", { class: "form-grid" },
    REGISTER_FIELDS.map(([name, label, type, , help]) =>
      fieldBox(name, label, h("input", { type, step: type === "number" ? "any" : undefined }), help)));
  const params = fieldBox("params", "Params (JSON object)", h("textarea", {}, "{}"));
  const files = fieldBox("files", "Files (JSON array of {path, size_bytes, sha256})", h("textarea", { rows: 5 }, "[]"));
  const paste = h("textarea", { id: "reg-paste", rows: 3, placeholder: "Paste a whole registration (JSON) to fill the fields" });
  const general = h("p", { class: "problem", role: "alert" });
  const done = h("p", { role: "status" });

  const fill = () => {
    let draft;
    try {
      draft = JSON.parse(paste.value);
    } catch (e) {
      general.textContent = `The pasted text is not JSON: ${e.message}`;
      return;
    }
    for (const [name] of REGISTER_FIELDS) inputs[name].value = draft[name] ?? "";
    inputs.params.value = JSON.stringify(draft.params ?? {}, null, 2);
    inputs.files.value = JSON.stringify(draft.files ?? [], null, 2);
    general.textContent = "";
  };

  const submit = async (event) => {
    event.preventDefault();
    for (const p of Object.values(problems)) p.textContent = "";
    general.textContent = "";
    done.textContent = "";
    const draft = {};
    let local = false;
    for (const [name, , type] of REGISTER_FIELDS) {
      const raw = inputs[name].value.trim();
      if (raw === "") continue;
      draft[name] = type === "number" ? Number(raw) : raw;
    }
    for (const [name, want] of [["params", "object"], ["files", "array"]]) {
      try {
        const value = JSON.parse(inputs[name].value || (want === "array" ? "[]" : "{}"));
        const ok = want === "array" ? Array.isArray(value) : value && typeof value === "object" && !Array.isArray(value);
        if (!ok) throw new Error(`must be a JSON ${want}`);
        draft[name] = value;
      } catch (e) {
        problems[name].textContent = `${name}: ${e.message}`;
        local = true;
      }
    }
    if (local) return;
    try {
      const model = await api("/v1/models", { method: "POST", body: draft });
      done.textContent = `Registered ${model.name} (model ${model.id}).`;
      state.models.push(model);
      route();
    } catch (e) {
      showProblems(e, problems, general);
    }
  };

  return h("details", { id: "register" },
    h("summary", {}, h("h2", { class: "inline" }, "Register a model")),
    h("form", { onsubmit: submit, novalidate: true },
      h("div", { class: "field" },
        h("label", { for: "reg-paste" }, "Registration JSON"),
        paste,
        h("div", { class: "actions" }, h("button", { type: "button", onclick: fill }, "Fill the fields"))),
      grid, params, files, general,
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Register")),
      done));
}

/** The server's 400 lists every problem, each starting with its field. */
function showProblems(error, problems, general) {
  const text = error.message.replace(/^invalid model: /, "");
  const unplaced = [];
  for (const problem of text.split("; ")) {
    const field = problem.match(/^([a-z_]+)/)?.[1];
    const target = problems[field] ?? (problem.startsWith("files[") ? problems.files : null);
    if (target && error.status === 400) {
      target.textContent = target.textContent ? `${target.textContent}; ${problem}` : problem;
    } else {
      unplaced.push(problem);
    }
  }
  general.textContent = unplaced.join("; ");
  const first = Object.values(problems).find((p) => p.textContent);
  first?.closest(".field")?.querySelector("input, textarea")?.focus();
}

// ---- deployers -----------------------------------------------------------

function deployersBlock() {
  const block = h("section", { id: "deployers", "aria-labelledby": "deployers-title" });
  fillDeployers(block);
  return block;
}

// Where a deployer comes from: the plugins folder, or a version stored
// over the API (who pushed it, and when).
function origin(d) {
  if (d.origin !== "api") return "plugins folder";
  const by = d.added_by ? ` by ${d.added_by}` : "";
  return `stored over the API: version ${d.version}, pushed${by} ${when(d.added_at)}`;
}

function fillDeployers(block) {
  const cards = state.deployers.map((d) =>
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
        h("dt", {}, "Env vars"), h("dd", { class: "mono" }, d.env.length ? d.env.join(", ") : "none"),
        h("dt", {}, "Memory"), h("dd", {}, `${d.memory_mib} MiB`),
        h("dt", {}, "Time limit"), h("dd", {}, duration(d.timeout_s * 1000)),
        h("dt", {}, "Output quota"), h("dd", {}, `${d.out_mib} MiB`))));
  const empty = state.deployers.length === 0 && h("p", { class: "notice", id: "no-deployers" },
    "No deployer is loaded, so nothing can be deployed. Copy a deployer (NAME.wasm, with an optional NAME.toml manifest) into the server's plugins folder (--plugins-dir, default ./plugins); berth picks it up within seconds. make plugins builds the examples.");
  const loading = state.loading.length > 0 && h("p", { class: "muted" }, `Still loading: ${state.loading.join(", ")}`);
  const rejected = state.rejected.length > 0 && [
    h("h3", { id: "refused-title" }, "Refused plugins"),
    table(["File", "Origin", "Reason"], state.rejected.map((r) =>
      h("tr", { "data-rejected": r.file },
        h("td", { class: "mono" }, r.file),
        h("td", {}, r.origin === "api" ? "stored over the API" : "plugins folder"),
        h("td", { class: "error-text wrap" }, r.reason))),
    { id: "refused" }),
  ];
  const parts = [h("h2", { id: "deployers-title" }, "Deployers"), empty, loading, h("div", { class: "cards" }, cards), rejected];
  block.replaceChildren(...parts.flat().filter(Boolean));
}

async function deployersView() {
  state.view = { kind: "deployers" };
  try {
    await loadDeployers();
  } catch (e) {
    return show(failure(e));
  }
  show(deployersBlock());
}

async function refreshDeployers() {
  try {
    await loadDeployers();
  } catch {
    return;
  }
  const block = document.getElementById("deployers");
  if (block) fillDeployers(block);
  for (const button of document.querySelectorAll("button[aria-label^='Deploy ']")) {
    button.disabled = state.deployers.length === 0;
  }
  if (deployDialog.open && deployDialog.model) renderDeploy(deployDialog.model);
}

// ---- one model -----------------------------------------------------------

function deploymentRow(d) {
  const running = d.status === "running";
  const open = running || d.status === "queued";
  const progressCell = h("td", { class: "progress-cell" });
  const live = state.live.get(d.id);
  if (running) fillProgress(progressCell, live?.phase ?? d.phase, live?.progress ?? d.progress);
  else state.live.delete(d.id);
  return h("tr", { "data-deployment": d.id, "data-status": d.status },
    h("td", {}, h("a", { href: `#/deployments/${d.id}` }, `#${d.id}`)),
    h("td", { class: "status-cell" }, statusBadge(d.status)),
    progressCell,
    h("td", {}, d.deployer),
    h("td", { class: "wrap mono ref-cell" }, refLink(d)),
    h("td", { class: "num duration-cell" }, duration(d.duration_ms)),
    h("td", { class: "hide-narrow" }, when(d.created_at)),
    h("td", { class: "hide-narrow" }, d.created_by ?? ""),
    h("td", { class: "error-text wrap error-cell" }, d.error ?? ""),
    h("td", {}, open && h("button", {
      type: "button",
      class: "cancel",
      "aria-label": `Cancel deployment ${d.id}`,
      onclick: (e) => cancel(d.id, e.target),
    }, "Cancel")));
}

function fillProgress(cell, phase, p) {
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
function refLink(d) {
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

function artifactLink(id, path, label = path) {
  const url = artifactUrl(id, path);
  return h("a", {
    href: url,
    download: path.split("/").pop(),
    onclick: (event) => {
      // A link cannot carry the token: fetch with it and hand over the bytes.
      if (!sessionStorage.getItem(TOKEN_KEY)) return;
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

async function cancel(id, button) {
  button.disabled = true;
  try {
    const d = await api(`/v1/deployments/${id}/cancel`, { method: "POST" });
    upsertDeployment(d);
  } catch (e) {
    button.disabled = false;
    button.title = e.message;
  }
}

async function modelView(id) {
  state.view = { kind: "model", id };
  let model;
  let deployments;
  try {
    [model, deployments] = await Promise.all([
      api(`/v1/models/${id}`),
      api(`/v1/models/${id}/deployments`),
      loadDeployers(),
    ]);
  } catch (e) {
    return show(failure(e));
  }
  if (state.view.kind !== "model" || state.view.id !== id) return;
  const fields = [
    ["Job id", model.job_id], ["Base model", model.base_model], ["Size label", model.model_size],
    ["Dataset", model.dataset], ["Examples", model.num_examples], ["Training steps", model.num_train_steps],
    ["Final loss", model.final_loss ?? ""], ["Source", model.source], ["Registered", when(model.created_at)],
    ["Registered by", model.created_by ?? ""],
  ];
  const body = h("tbody", { id: "deployments-body" }, deployments.deployments.map(deploymentRow));
  show(
    h("p", {}, h("a", { href: "#/" }, "← Models")),
    h("h1", {}, model.name),
    h("div", { class: "toolbar" }, deployButton(model)),
    h("dl", { class: "fields" }, fields.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])),
    h("h2", {}, "Params"),
    h("pre", {}, JSON.stringify(model.params, null, 2)),
    h("h2", {}, "Files"),
    table(["Path", "Size", "sha256"], model.files.map((f) =>
      h("tr", {}, h("td", { class: "wrap mono" }, f.path), h("td", { class: "num", title: `${f.size_bytes} bytes` }, bytes(f.size_bytes)), h("td", { class: "mono wrap" }, f.sha256)))),
    h("h2", {}, "Deployments"),
    h("div", { class: "table-wrap" },
      h("table", { id: "deployments" },
        h("thead", {}, h("tr", {},
          ["Id", "Status", "Phase", "Deployer", "Ref", "Duration", "Created", "By", "Error", ""].map((t, i) =>
            h("th", { scope: "col", class: [6, 7].includes(i) ? "hide-narrow" : undefined }, t)))),
        body)),
  );
  state.view.model = model;
}

/** A deployment's row on the model view, replaced or added on top. */
function upsertDeployment(d) {
  state.newest.set(d.model_id, d);
  const cell = document.getElementById(`newest-${d.model_id}`);
  if (cell) cell.replaceChildren(newestCell(d.model_id));
  if (state.view.kind === "deployment" && state.view.id === d.id) deploymentView(d.id);
  const body = document.getElementById("deployments-body");
  if (!body || state.view.kind !== "model" || state.view.id !== d.model_id) return;
  const row = deploymentRow(d);
  const old = body.querySelector(`tr[data-deployment="${d.id}"]`);
  const focused = old?.contains(document.activeElement);
  if (old) old.replaceWith(row);
  else body.prepend(row);
  if (focused) row.querySelector("a")?.focus();
}

// ---- one deployment ------------------------------------------------------

async function deploymentView(id) {
  state.view = { kind: "deployment", id };
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
    return show(failure(e));
  }
  if (state.view.kind !== "deployment" || state.view.id !== id) return;
  const progressCell = h("span", { id: "deployment-progress" });
  const live = state.live.get(d.id);
  if (d.status === "running") fillProgress(progressCell, live?.phase ?? d.phase, live?.progress ?? d.progress);
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
    (d.status === "running" || d.status === "queued") && h("div", { class: "actions" }, h("button", {
      type: "button", class: "cancel", "aria-label": `Cancel deployment ${d.id}`, onclick: (e) => cancel(d.id, e.target),
    }, "Cancel")),
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
    h("h2", {}, "Logs"),
    h("pre", { id: "logs" }, typeof logs === "string" && logs ? logs : "(nothing logged)"),
  );
}

// ---- the deploy dialog ---------------------------------------------------

const deployDialog = document.getElementById("deploy-dialog");
const deployBody = document.getElementById("deploy-body");
trapFocus(deployDialog);

function openDeploy(model) {
  deployDialog.model = model;
  renderDeploy(model);
  deployDialog.showModal();
  deployDialog.querySelector(".deployer input, .deployer select, .deployer textarea, .deployer button")?.focus();
}

deployDialog.addEventListener("close", () => {
  deployDialog.model = null;
});

function renderDeploy(model) {
  document.getElementById("deploy-title").textContent = `Deploy ${model.name}`;
  if (!state.deployers.length) {
    deployBody.replaceChildren(h("p", { class: "notice" }, "No deployer is loaded: add one to the plugins folder first."));
    return;
  }
  deployBody.replaceChildren(...state.deployers.map((d) => deployerSection(model, d)));
}

/** The schema's properties as form fields, if every one is a simple type. */
function formable(schema) {
  if (!schema || schema.type !== "object" || typeof schema.properties !== "object") return false;
  return Object.values(schema.properties).every((p) =>
    ["string", "integer", "number", "boolean"].includes(p.type) || Array.isArray(p.enum));
}

function deployerSection(model, deployer) {
  const id = `dep-${deployer.name}`;
  const problem = h("p", { class: "problem", id: `${id}-problem`, role: "alert" });
  const schema = deployer.options_schema;
  let collect;
  let controls;
  if (formable(schema)) {
    const required = new Set(schema.required ?? []);
    const fields = Object.entries(schema.properties).map(([name, prop]) => schemaField(id, name, prop, required.has(name)));
    controls = fields.map((f) => f.node);
    collect = () => {
      const options = {};
      for (const f of fields) {
        const value = f.value();
        if (value !== undefined) options[f.name] = value;
      }
      return options;
    };
  } else {
    const editor = h("textarea", {
      id: `${id}-json`, rows: 4, spellcheck: "false", "aria-describedby": `${id}-problem ${id}-json-help`,
    }, "{}");
    controls = [h("div", { class: "field" },
      h("label", { for: editor.id }, "Options (JSON object)"),
      editor,
      h("span", { class: "help", id: `${id}-json-help` },
        schema ? `Schema: ${JSON.stringify(schema)}` : "This deployer publishes no options schema."))];
    collect = () => {
      let value;
      try {
        value = JSON.parse(editor.value.trim() || "{}");
      } catch (e) {
        throw new Error(`options are not JSON: ${e.message}`);
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        const kind = Array.isArray(value) ? "an array" : value === null ? "null" : `a ${typeof value}`;
        throw new Error(`options must be a JSON object, not ${kind}`);
      }
      return value;
    };
  }
  const form = h("form", { novalidate: true, onsubmit: async (event) => {
    event.preventDefault();
    problem.textContent = "";
    let options;
    try {
      options = collect();
    } catch (e) {
      problem.textContent = e.message;
      return;
    }
    // Not `disabled`: a disabled button drops the keyboard focus to <body>.
    if (form.ariaBusy === "true") return;
    form.ariaBusy = "true";
    try {
      const d = await api(`/v1/models/${model.id}/deployments?wait=false`, {
        method: "POST", body: { deployer: deployer.name, options },
      });
      deployDialog.close();
      if (state.view.kind === "model" && state.view.id === model.id) upsertDeployment(d);
      else location.hash = `#/models/${model.id}`;
    } catch (e) {
      problem.textContent = e.message;
    } finally {
      form.ariaBusy = "false";
    }
  } },
  controls,
  problem,
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "aria-label": `Deploy with ${deployer.name}` }, "Deploy")));
  return h("section", { class: "deployer", "data-deployer": deployer.name, "aria-labelledby": `${id}-name` },
    h("h3", { id: `${id}-name` }, deployer.name),
    h("p", {}, deployer.description || h("span", { class: "muted" }, "no description")),
    form);
}

function schemaField(prefix, name, prop, required) {
  const id = `${prefix}-opt-${name}`;
  const help = prop.description && h("span", { class: "help", id: `${id}-help` }, prop.description);
  const problem = h("span", { class: "problem", id: `${id}-problem` });
  const describedBy = [help && `${id}-help`, `${id}-problem`].filter(Boolean).join(" ");
  let control;
  if (Array.isArray(prop.enum)) {
    control = h("select", { id, "aria-describedby": describedBy },
      !required && h("option", { value: "" }, "(default)"),
      prop.enum.map((v, i) => h("option", { value: String(i), selected: prop.default === v }, String(v))));
  } else if (prop.type === "boolean") {
    control = h("input", { id, type: "checkbox", checked: prop.default === true, "aria-describedby": describedBy });
  } else if (prop.type === "integer" || prop.type === "number") {
    control = h("input", {
      id, type: "number", min: prop.minimum, max: prop.maximum,
      step: prop.type === "integer" ? 1 : "any", value: prop.default, required, "aria-describedby": describedBy,
    });
  } else {
    control = h("input", { id, type: "text", value: prop.default, required, "aria-describedby": describedBy });
  }
  const label = h("label", { for: id }, name, required && h("span", { "aria-hidden": "true" }, " *"));
  const node = prop.type === "boolean"
    ? h("div", { class: "field check" }, control, label, help, problem)
    : h("div", { class: "field" }, label, control, help, problem);
  const value = () => {
    problem.textContent = "";
    if (Array.isArray(prop.enum)) {
      return control.value === "" ? undefined : prop.enum[Number(control.value)];
    }
    if (prop.type === "boolean") return control.checked;
    const raw = control.value.trim();
    if (raw === "") {
      if (required) return fail(`${name} is required`);
      return undefined;
    }
    if (prop.type === "string") return raw;
    const number = Number(raw);
    if (!Number.isFinite(number)) return fail(`${name} must be a number`);
    if (prop.type === "integer" && !Number.isInteger(number)) return fail(`${name} must be a whole number`);
    if (prop.minimum !== undefined && number < prop.minimum) return fail(`${name} must be at least ${prop.minimum}`);
    if (prop.maximum !== undefined && number > prop.maximum) return fail(`${name} must be at most ${prop.maximum}`);
    return number;
  };
  const fail = (message) => {
    problem.textContent = message;
    control.focus();
    throw new Error(`options: ${message}`);
  };
  return { name, node, value };
}

// ---- the event stream ----------------------------------------------------

let stream = null;

function restartStream() {
  stream?.abort();
  stream = new AbortController();
  follow(stream.signal);
}

function setStream(text, live) {
  streamBadge.textContent = text;
  streamBadge.className = `stream ${live ? "live" : "down"}`;
}

async function follow(signal) {
  let delay = 500;
  let connectedBefore = false;
  while (!signal.aborted) {
    try {
      const response = await fetch("/v1/events", { headers: authHeaders(), signal });
      if (response.status === 401) {
        setStream("events: needs a token", false);
        return;
      }
      if (!response.ok) throw new Error(`events: ${response.status}`);
      setStream("live", true);
      delay = 500;
      // Events missed while away: read the records again.
      if (connectedBefore) route();
      connectedBefore = true;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          dispatch(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch {
      if (signal.aborted) return;
    }
    setStream("reconnecting…", false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

function dispatch(block) {
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) kind = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return;
  let event;
  try {
    event = JSON.parse(data.join("\n"));
  } catch {
    return;
  }
  switch (kind) {
    case "deployment.progress":
      return progressed(event);
    case "deployment.queued":
    case "deployment.started":
    case "deployment.completed":
    case "deployment.failed":
      return api(`/v1/deployments/${event.deploy_id}`).then(upsertDeployment, () => {});
    case "plugin.loaded":
    case "plugin.rejected":
    case "plugin.removed":
      return refreshDeployers();
    default:
  }
}

function progressed(event) {
  state.live.set(event.deploy_id, event);
  const row = document.querySelector(`#deployments-body tr[data-deployment="${event.deploy_id}"]`);
  const cell = row?.querySelector(".progress-cell");
  if (cell && row.dataset.status === "running") fillProgress(cell, event.phase, event.progress);
  const detail = document.getElementById("deployment-progress");
  if (detail && state.view.kind === "deployment" && state.view.id === event.deploy_id) {
    fillProgress(detail, event.phase, event.progress);
  }
}

// ---- start ---------------------------------------------------------------

route();
restartStream();
