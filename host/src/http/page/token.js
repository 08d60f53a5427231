// The visitor's API token: kept in this tab only (sessionStorage), asked
// for in the token dialog when the server answers 401 or the visitor
// clicks "API token". Never put into a URL.

import { trapFocus } from "./dom.js";

const KEY = "berth-token";
const dialog = document.getElementById("token-dialog");
const input = document.getElementById("token-input");
let changed = () => {};

/** The token given, or null. */
export function token() {
  return sessionStorage.getItem(KEY);
}

/** `then` runs each time a token is given or forgotten. */
export function onTokenChange(then) {
  changed = then;
}

export function askToken(reason) {
  if (dialog.open) return;
  document.getElementById("token-why").textContent =
    (reason ? `${reason}. ` : "") +
    "The token is kept in this tab only (sessionStorage) and sent as Authorization: Bearer.";
  input.value = "";
  dialog.showModal();
}

trapFocus(dialog);
dialog.addEventListener("close", () => {
  if (dialog.returnValue === "save" && input.value.trim()) {
    sessionStorage.setItem(KEY, input.value.trim());
  } else if (dialog.returnValue === "forget") {
    sessionStorage.removeItem(KEY);
  } else {
    return;
  }
  changed();
});
document.getElementById("token-button").addEventListener("click", () => askToken());
