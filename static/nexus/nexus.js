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
