// Building the page's DOM. Text is always set with textContent (through
// h()), never as HTML: names, errors and logs are written by others.

/** An element with attributes (`on…`: listeners) and children. */
export function h(tag, attrs = {}, ...children) {
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

export function table(headers, rows, attrs = {}) {
  return h("div", { class: "table-wrap" },
    h("table", attrs,
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
}

/** What a view draws, in place of what the last one drew. */
export function show(...nodes) {
  document.getElementById("main").replaceChildren(...nodes);
}

/** A view that could not be drawn: why. */
export function failure(error) {
  return h("p", { class: "error-text", role: "alert" }, error.message);
}

/** Tab and Shift+Tab cycle inside an open dialog, never leave it. */
export function trapFocus(dialog) {
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
