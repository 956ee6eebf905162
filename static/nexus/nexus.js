// The console's page behaviour (docs/ui.md): copy buttons, toasts, dialogs, drawers, tabs, the
// token chooser, the live indicator, and relative times kept current. No framework. Listeners
// sit on the document, so fragments swapped in live keep working.
"use strict";

// Numbers and times, written as nexus/ui/format.py writes them (a browser test holds the two to
// one table). Used for relative times that age while the page is open and by charts.js.
const format = (() => {
  const MISSING = "—";
  // Halves round up on both sides (format.py's _whole and _tenths).
  const whole = (value) => Math.floor(value + 0.5);
  const tenths = (value) => Math.floor(value * 10 + 0.5) / 10;
  const fixed1 = (value) => tenths(value).toFixed(1);
  const oneDecimal = (value) => {
    const text = fixed1(value);
    return text.endsWith(".0") ? text.slice(0, -2) : text;
  };
  const number = (value) => (value == null ? MISSING : whole(value).toLocaleString("en-US"));

  function duration(seconds) {
    if (seconds == null || Number.isNaN(seconds)) return MISSING;
    if (seconds < 0) return `-${duration(-seconds)}`;
    const ms = seconds * 1000;
    if (ms < 1 && ms !== 0) return `${fixed1(ms)} ms`;
    if (whole(ms) < 1000) return `${whole(ms)} ms`;
    if (tenths(seconds) < 10) return `${fixed1(seconds)} s`;
    if (whole(seconds) < 60) return `${whole(seconds)} s`;
    if (whole(seconds) < 3600) {
      const total = whole(seconds);
      const [minutes, rest] = [Math.floor(total / 60), total % 60];
      return rest ? `${minutes} min ${rest} s` : `${minutes} min`;
    }
    if (whole(seconds / 60) < 24 * 60) {
      const total = whole(seconds / 60);
      const [hours, minutes] = [Math.floor(total / 60), total % 60];
      return minutes ? `${hours} h ${minutes} min` : `${hours} h`;
    }
    const total = whole(seconds / 3600);
    const [days, hours] = [Math.floor(total / 24), total % 24];
    return hours ? `${days} d ${hours} h` : `${days} d`;
  }

  function rate(perSecond, unit) {
    if (perSecond == null || Number.isNaN(perSecond)) return MISSING;
    if (perSecond === 0) return `0 ${unit}/s`;
    if (Math.abs(perSecond) < 10) return `${fixed1(perSecond)} ${unit}/s`;
    return `${number(perSecond)} ${unit}/s`;
  }

  const SIZE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  function binarySize(size) {
    if (size == null) return MISSING;
    if (size < 0) return `-${binarySize(-size)}`;
    if (size < 1024) return `${whole(size)} B`;
    let exponent = Math.min(Math.floor(Math.log(size) / Math.log(1024)), SIZE_UNITS.length - 1);
    let value = size / 1024 ** exponent;
    if (tenths(value) >= 1024 && exponent < SIZE_UNITS.length - 1) {
      exponent += 1;
      value /= 1024;
    }
    return `${oneDecimal(value)} ${SIZE_UNITS[exponent]}`;
  }

  function percent(value, of = 1) {
    if (value == null || !of || Number.isNaN(value)) return MISSING;
    const points = (value / of) * 100;
    if (points !== 0 && Math.abs(points) < 10) return `${oneDecimal(points)} %`;
    return `${whole(points)} %`;
  }

  const AGO_UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  function ago(when, now) {
    if (when == null) return MISSING;
    let seconds = (now - when) / 1000;
    const future = seconds < 0;
    seconds = Math.abs(seconds);
    if (seconds < 1) return "just now";
    if (seconds >= 30 * 86400) return new Date(when).toISOString().slice(0, 10);
    const [size, unit] = AGO_UNITS.find(([size]) => seconds >= size);
    const amount = `${Math.floor(seconds / size)} ${unit}`;
    return future ? `in ${amount}` : `${amount} ago`;
  }

  // A chart value in its unit (nexus/ui/charts.py UNITS).
  function value(amount, unit) {
    switch (unit) {
      case "ms": return amount == null ? MISSING : duration(amount / 1000);
      case "s": return duration(amount);
      case "req/s": return rate(amount, "req");
      case "tok/s": return rate(amount, "tok");
      case "%": return percent(amount);
      case "B": return binarySize(amount);
      default: return number(amount);
    }
  }

  return { number, duration, rate, binarySize, percent, ago, value };
})();

// A form pushed over the websocket was rendered for no one user, so {% csrf_token %} gave it
// nothing: posts from the page carry the page's own token instead.
function csrfToken() {
  return document.querySelector('meta[name="csrf-token"]')?.content ?? "";
}

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.method !== "post" || form.querySelector('input[name="csrfmiddlewaretoken"]')) return;
  const input = document.createElement("input");
  input.type = "hidden";
  input.name = "csrfmiddlewaretoken";
  input.value = csrfToken();
  form.append(input);
}, true);

document.addEventListener("htmx:configRequest", (event) => {
  if (event.detail.verb !== "get") event.detail.headers["X-CSRFToken"] = csrfToken();
});

function announce(text) {
  const region = document.getElementById("announcer");
  if (!region) return;
  // Emptied first: the same words twice in a row are announced twice.
  region.textContent = "";
  setTimeout(() => { region.textContent = text; }, 50);
}

// Copy buttons: data-copy="text", or data-copy-code for the code of the block it sits in.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy], button[data-copy-code]");
  if (!button) return;
  const text = button.hasAttribute("data-copy-code")
    ? button.closest(".code-block").querySelector("code").textContent
    : button.dataset.copy;
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
    announce("Copied");
  } catch {
    button.textContent = "Select and copy";
    announce("Could not copy: select the text and copy it");
  }
  setTimeout(() => { button.textContent = label; }, 1500);
});

// Toasts: from Django messages on the page, from htmx responses (HX-Trigger), or Nexus.toast().
const TOAST_MS = 6000;

function dismissLater(toast) {
  // Errors stay until dismissed: an operator must not miss them.
  if (toast.dataset.level === "error") return;
  let timer = setTimeout(() => toast.remove(), TOAST_MS);
  toast.addEventListener("mouseenter", () => clearTimeout(timer));
  toast.addEventListener("mouseleave", () => { timer = setTimeout(() => toast.remove(), TOAST_MS); });
}

function toast(text, level = "success") {
  const region = document.getElementById("toasts");
  if (!region) return;
  const item = document.createElement("div");
  item.className = "toast";
  item.dataset.level = level;
  if (level === "error") item.setAttribute("role", "alert");
  const words = document.createElement("span");
  words.className = "toast-text";
  words.textContent = text;
  const close = document.createElement("button");
  close.type = "button";
  close.className = "close";
  close.dataset.close = "";
  close.setAttribute("aria-label", "Dismiss");
  close.textContent = "✕";
  item.append(words, close);
  region.append(item);
  dismissLater(item);
}

// The HX-Trigger of nexus/ui/middleware.py: {"nexus:toasts": {"target": "body", "toasts": […]}}.
document.addEventListener("nexus:toasts", (event) => {
  for (const { text, level } of event.detail.toasts) toast(text, level);
});

// Dialogs and drawers: data-dialog="id" opens a confirmation (a modal); data-drawer="id" opens
// a drawer beside the page (not modal: the list stays usable); data-close closes either.
document.addEventListener("click", (event) => {
  const closer = event.target.closest("[data-close]");
  if (closer) {
    const box = closer.closest("dialog, .toast");
    if (box instanceof HTMLDialogElement) box.close();
    else if (box) box.remove();
    return;
  }
  const opener = event.target.closest("[data-dialog], [data-drawer]");
  if (!opener) return;
  const target = document.getElementById(opener.dataset.dialog || opener.dataset.drawer);
  if (!(target instanceof HTMLDialogElement)) return;
  if (opener.dataset.dialog) {
    event.preventDefault();
    target.showModal();
    return;
  }
  // A drawer whose opener loads its body with htmx lets htmx handle the click.
  if (!opener.hasAttribute("hx-get")) event.preventDefault();
  if (!target.open) target.show();
});

// A live push never replaces an element that holds an open confirmation, nor one the pointer is
// pressing: the push would take the dialog away under the operator's eyes, and a press on a link
// that a push replaced before its release is no click at all (the button went down on the old
// link and came up on the new one; a CI run's click on a Live decision went nowhere). The pushed
// version waits, by the element's id, and replaces it once the dialog closes or the press ends.
const heldPushes = new Map();
let pressed = null;
const holds = (element) =>
  element.querySelector("dialog:modal") !== null || (pressed !== null && element.contains(pressed));
document.addEventListener("htmx:oobBeforeSwap", (event) => {
  const { target, fragment } = event.detail;
  if (!target.id || !holds(target)) return;
  event.detail.shouldSwap = false;
  heldPushes.set(target.id, [...fragment.children].map((element) => element.outerHTML).join(""));
});
function releaseHeldPushes() {
  for (const [id, html] of heldPushes) {
    const held = document.getElementById(id);
    if (held && holds(held)) continue;
    heldPushes.delete(id);
    if (held) htmx.swap(held, html, { swapStyle: "outerHTML" });
  }
}
document.addEventListener("pointerdown", (event) => { pressed = event.target; }, true);
for (const type of ["pointerup", "pointercancel"]) {
  document.addEventListener(type, () => {
    pressed = null;
    // After the click that this release makes, which goes to the element pressed.
    setTimeout(releaseHeldPushes);
  }, true);
}
document.addEventListener("close", (event) => {
  if (event.target instanceof HTMLDialogElement) releaseHeldPushes();
}, true);  // "close" does not bubble

document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  for (const drawer of document.querySelectorAll("dialog.drawer[open]")) drawer.close();
});

// Tabs (WAI-ARIA tabs pattern, any role="tablist"): every panel shows without JavaScript; with
// it, one at a time, chosen by click or the arrow keys, Home and End.
function selectTab(tab) {
  const list = tab.closest("[role=tablist]");
  for (const other of list.querySelectorAll("[role=tab]")) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    const panel = document.getElementById(other.getAttribute("aria-controls"));
    if (panel) panel.hidden = !selected;
  }
}

function initTabs(root) {
  for (const list of root.querySelectorAll("[role=tablist]")) {
    const chosen = list.querySelector("[role=tab][aria-selected=true]") || list.querySelector("[role=tab]");
    if (chosen) selectTab(chosen);
  }
}

document.addEventListener("click", (event) => {
  const tab = event.target.closest("[role=tab]");
  if (tab) selectTab(tab);
});

document.addEventListener("keydown", (event) => {
  const tab = event.target.closest("[role=tab]");
  if (!tab || !["ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) return;
  const tabs = [...tab.closest("[role=tablist]").querySelectorAll("[role=tab]")];
  const at = tabs.indexOf(tab);
  const next = {
    ArrowLeft: tabs[(at - 1 + tabs.length) % tabs.length],
    ArrowRight: tabs[(at + 1) % tabs.length],
    Home: tabs[0],
    End: tabs[tabs.length - 1],
  }[event.key];
  event.preventDefault();
  selectTab(next);
  next.focus();
});

document.addEventListener("DOMContentLoaded", () => initTabs(document));
document.addEventListener("htmx:load", (event) => initTabs(event.target));

// An error beside a field is about the value that was sent: once the field is changed, the
// error is hidden (the server checks the new value when the form is sent again).
function hideStaleFieldError(event) {
  const group = event.target.closest?.(".field.has-error");
  if (!group) return;
  group.classList.remove("has-error");
  for (const list of group.querySelectorAll(".errorlist")) list.hidden = true;
}
document.addEventListener("input", hideStaleFieldError);
document.addEventListener("change", hideStaleFieldError);

// The snippets' token chooser puts the chosen token into every snippet beside it.
document.addEventListener("change", (event) => {
  const chooser = event.target.closest("select[data-token-chooser]");
  if (!chooser) return;
  for (const slot of chooser.closest(".snippets").querySelectorAll("[data-snippet-token]")) {
    slot.textContent = chooser.value;
  }
});

// The live indicator: shown once the page's websocket starts; the server sends the current
// state on every (re)connect, so a page that was cut off catches up by itself.
function showLiveStatus(state, text) {
  for (const indicator of document.querySelectorAll("[data-live-status]")) {
    indicator.hidden = false;
    indicator.dataset.liveStatus = state;
    indicator.textContent = text;
  }
}

document.addEventListener("htmx:wsConnecting", () => showLiveStatus("connecting", "Connecting…"));
document.addEventListener("htmx:wsOpen", () => showLiveStatus("open", "Live"));
document.addEventListener("htmx:wsClose", () => showLiveStatus("closed", "Reconnecting…"));

// Relative times age while the page stays open.
function refreshTimes() {
  const now = Date.now();
  for (const time of document.querySelectorAll("time[data-ago]")) {
    time.textContent = format.ago(Date.parse(time.getAttribute("datetime")), now);
  }
}

setInterval(refreshTimes, 5000);

document.addEventListener("DOMContentLoaded", () => {
  for (const item of document.querySelectorAll("#toasts .toast")) dismissLater(item);
});

window.Nexus = { format, toast, announce };

// Route filters (the service page): rows whose data-health / data-traffic differ from a chosen
// value are hidden; applied again after a push replaces the table.
function filterRoutes() {
  for (const filters of document.querySelectorAll("[data-route-filters]")) {
    const chosen = [...filters.querySelectorAll("select[data-route-filter]")]
      .filter((select) => select.value)
      .map((select) => [select.dataset.routeFilter, select.value]);
    for (const row of document.querySelectorAll(`${filters.dataset.routeFilters} tbody tr`)) {
      row.hidden = chosen.some(([name, value]) => row.dataset[name] !== value);
    }
  }
}

document.addEventListener("change", (event) => {
  if (event.target.closest("select[data-route-filter]")) filterRoutes();
});
document.addEventListener("htmx:oobAfterSwap", filterRoutes);
document.addEventListener("htmx:afterSwap", filterRoutes);

// A dialog swapped in with data-show-modal opens at once (the Validate popup).
document.addEventListener("htmx:afterSwap", (event) => {
  for (const dialog of event.detail.target.querySelectorAll("dialog[data-show-modal]")) {
    if (!dialog.open) dialog.showModal();
  }
});
