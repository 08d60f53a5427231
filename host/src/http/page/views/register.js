// The "Register a model" form: fields, or a whole registration pasted as
// JSON. Params and files are checked as JSON here; every other rule is the
// server's, whose 400 lists each problem with its field (showProblems).

import { api } from "../api.js";
import { h } from "../dom.js";

const FIELDS = [
  ["name", "Name", "text"],
  ["job_id", "Job id", "text"],
  ["base_model", "Base model", "text"],
  ["model_size", "Size label", "text"],
  ["dataset", "Dataset", "text"],
  ["num_examples", "Examples", "number"],
  ["num_train_steps", "Training steps", "number"],
  ["final_loss", "Final loss", "number"],
  ["source", "Source URL template", "text", "e.g. https://hub.internal/models/{job_id}/{path}"],
];

/** The form; `registered(model)` runs with the model the server stored. */
export function registerForm(registered) {
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
    FIELDS.map(([name, label, type, help]) =>
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
    for (const [name] of FIELDS) inputs[name].value = draft[name] ?? "";
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
    for (const [name, , type] of FIELDS) {
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
      registered(model);
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

/** Each problem the server lists (`{field, message}`, field as
 * `files[0].path`) next to the input it names, the others under the form;
 * an answer without a list, its sentence. Focus goes to the first input
 * with a problem. */
function showProblems(error, problems, general) {
  const unplaced = [];
  for (const { field, message } of error.problems) {
    const target = problems[String(field).match(/^[a-z_]+/)?.[0]];
    if (target) target.textContent = target.textContent ? `${target.textContent}; ${message}` : message;
    else unplaced.push(message);
  }
  general.textContent = error.problems.length ? unplaced.join("; ") : error.message;
  const first = Object.values(problems).find((p) => p.textContent);
  first?.closest(".field")?.querySelector("input, textarea")?.focus();
}
