// Figures as people read them. bytes() and duration() follow the server's
// host/src/human.rs, so the page and the CLI write a figure alike.

import { h } from "./dom.js";

export function bytes(n) {
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

/** A training value the registration did not give: null in the API. */
export function known(value) {
  return value === null || value === undefined ? "unknown" : value;
}

/** As the server writes durations (human::duration): 850ms, 12.3s, 45s,
 * 1m 30s, 30m, 2h, 2h 1m. */
export function duration(ms) {
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

/** A timestamp from the API in the visitor's own locale. */
export function when(text) {
  if (!text) return "";
  const date = new Date(text);
  return Number.isNaN(date.getTime()) ? text : date.toLocaleString();
}

export function statusBadge(status) {
  return h("span", { class: `status ${status}`, "data-status": status }, status);
}
