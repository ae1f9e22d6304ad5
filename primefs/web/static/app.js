// primefs web view. Live parts: an element with data-sse opens one EventSource; each "patch" event
// names an element to replace or append to, with HTML rendered (and escaped) by the server.
(function () {
  "use strict";
  const badge = document.getElementById("live");
  function show(state, text) {
    if (!badge) return;
    badge.hidden = false;
    badge.className = "live " + state;
    badge.textContent = text;
  }
  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }
  for (const el of document.querySelectorAll("[data-sse]")) {
    const source = new EventSource(el.dataset.sse);
    source.addEventListener("open", () => show("on", "live"));
    source.addEventListener("error", () => show("off", "reconnecting…"));
    source.addEventListener("patch", (message) => {
      const patch = JSON.parse(message.data);
      const target = document.getElementById(patch.target);
      if (!target) return;
      if (patch.op === "append") {
        const stick = nearBottom();
        const box = document.createElement("template");
        box.innerHTML = patch.html;
        for (const el of Array.from(box.content.children)) {
          // a cell, once written, takes the place of its call shown as running (the first with its id)
          const call = el.classList.contains("ev-cell") && !el.classList.contains("pending")
            ? target.querySelector(`.ev-cell.pending[data-call="${CSS.escape(el.dataset.call || "")}"]`) : null;
          if (call) call.replaceWith(el); else target.append(el);
        }
        if (stick) window.scrollTo(0, document.body.scrollHeight);
      } else {
        target.innerHTML = patch.html;
      }
    });
  }
  // forms that change something ask first (stop, revert)
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  // Ctrl+Enter sends mail
  const text = document.getElementById("mail-text");
  if (text) {
    text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) text.form.requestSubmit();
    });
  }
})();
