// Approvals (#/approvals): the deployments rules hold for an admin, each
// with Approve and Reject (and a comment kept with the decision), kept
// live from the event stream; and the rules, with their last firing.

import { api } from "../api.js";
import { failure, h, show, table } from "../dom.js";
import { when } from "../format.js";
import { enter, isShown } from "../state.js";

export async function approvalsView() {
  const view = enter();
  let pending;
  let rules;
  try {
    [pending, rules] = await Promise.all([api("/v1/approvals"), api("/v1/rules")]);
  } catch (e) {
    if (isShown(view)) show(failure(e));
    return;
  }
  if (!isShown(view)) return;
  const block = h("section", { id: "approvals", "aria-labelledby": "approvals-title" });
  fillPending(block, pending.deployments);
  show(block, rulesBlock(rules.rules));
  // A deployment changed (held, approved, rejected, expired): read the
  // list again, as any server may have decided.
  view.deployment = async () => {
    try {
      const fresh = await api("/v1/approvals");
      if (isShown(view)) fillPending(block, fresh.deployments);
    } catch {
      // The next change tries again.
    }
  };
}

function fillPending(block, deployments) {
  const title = h("h2", { id: "approvals-title" }, "Awaiting approval");
  if (!deployments.length) {
    block.replaceChildren(title, h("p", { class: "muted", id: "no-approvals" }, "Nothing awaits approval."));
    return;
  }
  block.replaceChildren(title, table(
    ["Id", "Model", "Deployer", "Rule", "Options", "Since", "Comment", ""],
    deployments.map(pendingRow),
    { id: "pending" }));
}

function pendingRow(d) {
  const comment = h("input", { type: "text", "aria-label": `Comment on deployment ${d.id}`, maxlength: "2000" });
  const error = h("span", { class: "error-text" });
  const decide = (verb) => async (event) => {
    const buttons = event.target.closest("td").querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const body = comment.value.trim() ? { comment: comment.value.trim() } : {};
      await api(`/v1/deployments/${d.id}/${verb}`, { method: "POST", body });
      event.target.closest("tr").remove();
    } catch (e) {
      buttons.forEach((b) => { b.disabled = false; });
      error.textContent = e.message;
    }
  };
  return h("tr", { "data-deployment": d.id },
    h("td", {}, h("a", { href: `#/deployments/${d.id}` }, `#${d.id}`)),
    h("td", {}, h("a", { href: `#/models/${d.model_id}` }, `model ${d.model_id}`)),
    h("td", {}, d.deployer),
    h("td", {}, d.cause?.rule ?? ""),
    h("td", { class: "mono wrap" }, JSON.stringify(d.options)),
    h("td", {}, when(d.created_at)),
    h("td", {}, comment),
    h("td", {},
      h("button", { type: "button", class: "approve", onclick: decide("approve") }, "Approve"), " ",
      h("button", { type: "button", class: "reject", onclick: decide("reject") }, "Reject"), " ",
      error));
}

function rulesBlock(rules) {
  const title = h("h2", { id: "rules-title" }, "Rules");
  if (!rules.length) {
    return h("section", { id: "rules" }, title, h("p", { class: "muted" },
      "No rules: POST /v1/rules, berth rules add FILE, or --rules-file."));
  }
  return h("section", { id: "rules", "aria-labelledby": "rules-title" }, title, table(
    ["Name", "Origin", "When", "Deploy", "Approval", "Last firing"],
    rules.map((r) => {
      const last = r.firings[0];
      const fired = !last ? "" : last.deployment_id
        ? h("a", { href: `#/deployments/${last.deployment_id}` }, `${when(last.created_at)}: #${last.deployment_id}`)
        : h("span", { class: "error-text" }, `${when(last.created_at)}: ${last.error}`);
      return h("tr", { "data-rule": r.name },
        h("td", {}, r.disabled ? `${r.name} (disabled)` : r.name),
        h("td", {}, r.origin === "file" ? "rules file" : "API"),
        h("td", {}, r.when.deployer ? `${r.when.deployer} completed` : "model registered"),
        h("td", {}, r.deploy.deployer),
        h("td", {}, r.require_approval ? "required" : ""),
        h("td", { class: "wrap" }, fired));
    }),
    { id: "rules-table" }));
}
