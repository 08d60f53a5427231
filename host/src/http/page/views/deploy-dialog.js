// The deploy dialog: one form per loaded deployer, drawn from its options
// schema when every option is a simple type (otherwise a JSON editor),
// checked here before anything is sent; and the Deploy buttons that open
// it. Knows nothing of the view behind it: the caller says what follows a
// deployment.

import { api } from "../api.js";
import { h, trapFocus } from "../dom.js";
import { catalog } from "../state.js";

const dialog = document.getElementById("deploy-dialog");
const body = document.getElementById("deploy-body");
/** What the open dialog deploys: `{ model, deployed }`, or null. */
let deploying = null;

trapFocus(dialog);
dialog.addEventListener("close", () => {
  deploying = null;
});

/** A button opening the dialog for `model`; `deployed(d)` runs with the
 * deployment the server accepted. */
export function deployButton(model, deployed) {
  const none = catalog.deployers.length === 0;
  return h("button", {
    type: "button",
    class: "primary",
    "data-deploy": model.id,
    disabled: none,
    title: none ? "no deployer is loaded" : undefined,
    "aria-label": `Deploy ${model.name}`,
    onclick: () => openDeploy(model, deployed),
  }, "Deploy");
}

/** The deployers changed: the buttons and an open dialog follow. */
export function deployersChanged() {
  for (const button of document.querySelectorAll("button[data-deploy]")) {
    button.disabled = catalog.deployers.length === 0;
  }
  if (dialog.open && deploying) render();
}

function openDeploy(model, deployed) {
  deploying = { model, deployed };
  render();
  dialog.showModal();
  dialog.querySelector(".deployer input, .deployer select, .deployer textarea, .deployer button")?.focus();
}

function render() {
  document.getElementById("deploy-title").textContent = `Deploy ${deploying.model.name}`;
  if (!catalog.deployers.length) {
    body.replaceChildren(h("p", { class: "notice" }, "No deployer is loaded: add one to the plugins folder first."));
    return;
  }
  body.replaceChildren(...catalog.deployers.map((d) => deployerSection(deploying, d)));
}

/** The schema's properties as form fields, if every one is a simple type. */
function formable(schema) {
  if (!schema || schema.type !== "object" || typeof schema.properties !== "object") return false;
  return Object.values(schema.properties).every((p) =>
    ["string", "integer", "number", "boolean"].includes(p.type) || Array.isArray(p.enum));
}

function deployerSection({ model, deployed }, deployer) {
  const id = `dep-${deployer.name}`;
  const problem = h("p", { class: "problem", id: `${id}-problem`, role: "alert" });
  const schema = deployer.options_schema;
  const { controls, collect } = formable(schema) ? schemaForm(id, schema) : jsonEditor(id, schema);
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
      dialog.close();
      deployed(d);
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

/** One field per option; `collect()` the options, or throws why not. */
function schemaForm(id, schema) {
  const required = new Set(schema.required ?? []);
  const fields = Object.entries(schema.properties).map(([name, prop]) => schemaField(id, name, prop, required.has(name)));
  const collect = () => {
    const options = {};
    for (const f of fields) {
      const value = f.value();
      if (value !== undefined) options[f.name] = value;
    }
    return options;
  };
  return { controls: fields.map((f) => f.node), collect };
}

/** The options as JSON text, for a schema the form cannot draw (or none). */
function jsonEditor(id, schema) {
  const editor = h("textarea", {
    id: `${id}-json`, rows: 4, spellcheck: "false", "aria-describedby": `${id}-problem ${id}-json-help`,
  }, "{}");
  const controls = [h("div", { class: "field" },
    h("label", { for: editor.id }, "Options (JSON object)"),
    editor,
    h("span", { class: "help", id: `${id}-json-help` },
      schema ? `Schema: ${JSON.stringify(schema)}` : "This deployer publishes no options schema."))];
  const collect = () => {
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
  return { controls, collect };
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
