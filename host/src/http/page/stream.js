// The event stream, /v1/events, read with fetch() (EventSource cannot send
// a header, and a token never goes into a URL): each change is handed to
// the shown view (state.js). Reconnects with backoff and, once back,
// has the records read again (events were missed meanwhile).

import { api, authHeaders } from "./api.js";
import { loadCatalog, progress, tell } from "./state.js";

const badge = document.getElementById("stream");
let stream = null;

/** Follows the stream anew (with the current token); `reconnected` runs
 * after a reconnection. */
export function restartStream(reconnected) {
  stream?.abort();
  stream = new AbortController();
  follow(stream.signal, reconnected);
}

function setBadge(text, live) {
  badge.textContent = text;
  badge.className = `stream ${live ? "live" : "down"}`;
}

async function follow(signal, reconnected) {
  let delay = 500;
  let connectedBefore = false;
  while (!signal.aborted) {
    try {
      const response = await fetch("/v1/events", { headers: authHeaders(), signal });
      if (response.status === 401) {
        setBadge("events: needs a token", false);
        return;
      }
      if (!response.ok) throw new Error(`events: ${response.status}`);
      setBadge("live", true);
      delay = 500;
      if (connectedBefore) reconnected();
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
    setBadge("reconnecting…", false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

/** One SSE block (`event:` and `data:` lines). */
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
      progress.set(event.deploy_id, event);
      return tell("progress", event);
    case "deployment.awaiting_approval":
    case "deployment.approved":
    case "deployment.queued":
    case "deployment.started":
    case "deployment.completed":
    case "deployment.failed":
      return api(`/v1/deployments/${event.deploy_id}`).then((d) => tell("deployment", d), () => {});
    case "plugin.loaded":
    case "plugin.rejected":
    case "plugin.removed":
      return loadCatalog().then(() => tell("catalog"), () => {});
    // A view that lists models or rules may ask again.
    case "model.registered":
      return tell("model", event);
    case "rule.failed":
      return tell("rule", event);
    default:
  }
}
