// What outlives one view: the deployers as the server last listed them,
// the newest progress of each running deployment, and which view is shown
// (so that live changes reach it and a late answer for a view left behind
// draws nothing).

import { api } from "./api.js";

/** GET /v1/deployers as last read: loaded deployers, refused plugins, and
 * the names still loading. */
export const catalog = { deployers: [], rejected: [], loading: [] };

export async function loadCatalog() {
  const body = await api("/v1/deployers");
  catalog.deployers = body.deployers;
  catalog.rejected = body.rejected;
  catalog.loading = body.loading ?? [];
}

/** deployment id → its latest progress event, newer than any row read
 * before it: a row fetched after a `started` event may arrive late. */
export const progress = new Map();

/** The shown view's handlers of live changes, each optional:
 * `deployment(d)` (a deployment's row changed), `progress(event)`,
 * `catalog()` (the deployers changed). */
let shown = {};

/** A new view is shown: its (empty) handlers, to fill in once it is drawn. */
export function enter() {
  shown = {};
  return shown;
}

/** Whether `view` (from enter()) is still the one shown. */
export function isShown(view) {
  return view === shown;
}

/** Tells the shown view of a change. */
export function tell(change, value) {
  shown[change]?.(value);
}
