// berth's admin page: every figure comes from /v1 with the visitor's token
// (api.js); live changes come from /v1/events (stream.js). This module
// routes the URL's #fragment to a view (views/) and starts the stream.
// Plain ES modules, no build step: each is served as it is in the source
// (http/page/mod.rs).

import { onTokenChange } from "./token.js";
import { restartStream } from "./stream.js";
import { approvalsView } from "./views/approvals.js";
import { deploymentView } from "./views/deployment.js";
import { deployersView } from "./views/deployers.js";
import { modelView } from "./views/model.js";
import { modelsView } from "./views/models.js";

function route() {
  const hash = location.hash || "#/";
  let match;
  if ((match = hash.match(/^#\/models\/(\d+)$/))) return modelView(Number(match[1]));
  if ((match = hash.match(/^#\/deployments\/(\d+)$/))) return deploymentView(Number(match[1]));
  if (hash === "#/deployers") return deployersView();
  if (hash === "#/approvals") return approvalsView();
  return modelsView();
}

window.addEventListener("hashchange", () => {
  route();
  document.getElementById("main").focus({ preventScroll: true });
});
onTokenChange(() => {
  restartStream(route);
  route();
});

route();
restartStream(route);
