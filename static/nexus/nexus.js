// Small page behaviour. Listeners sit on the document, so fragments swapped in live keep working.

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  try {
    await navigator.clipboard.writeText(button.dataset.copy);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Select and copy";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
});

function showLiveStatus(state, text) {
  for (const badge of document.querySelectorAll("[data-live-status]")) {
    badge.dataset.liveStatus = state;
    badge.textContent = text;
  }
}

let socketOpenedBefore = false;

document.addEventListener("htmx:wsOpen", () => {
  if (socketOpenedBefore) {
    // Changes made while the socket was down were never pushed: fetch the current fragments.
    for (const link of document.querySelectorAll("a[data-live-refresh]")) {
      htmx.ajax("GET", link.getAttribute("href"), {
        target: link.getAttribute("hx-target"),
        swap: link.getAttribute("hx-swap"),
      });
    }
  }
  socketOpenedBefore = true;
  showLiveStatus("open", "Live");
});
document.addEventListener("htmx:wsClose", () => showLiveStatus("closed", "Reconnecting…"));

// Tabs (role="tablist"): every panel shows without JavaScript; with it, one at a time.
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
  if (!tab || !["ArrowLeft", "ArrowRight"].includes(event.key)) return;
  const tabs = [...tab.closest("[role=tablist]").querySelectorAll("[role=tab]")];
  const step = event.key === "ArrowRight" ? 1 : -1;
  const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
  selectTab(next);
  next.focus();
});
document.addEventListener("DOMContentLoaded", () => initTabs(document));
document.addEventListener("htmx:load", (event) => initTabs(event.target));
