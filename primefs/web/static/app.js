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
  function apply(patch) {
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
  }
  function follow(el) {
    let lastId = "";
    function connect() {
      const url = new URL(el.dataset.sse, window.location.href);
      if (lastId) url.searchParams.set("pos", lastId);  // a new EventSource sends no Last-Event-ID
      const source = new EventSource(url);
      source.addEventListener("open", () => show("on", "live"));
      source.addEventListener("error", () => {
        if (source.readyState !== EventSource.CLOSED) {
          show("off", "reconnecting…");  // the browser tries again by itself: the server is away
          return;
        }
        // refused (a server restarted with a new token): say so, and try now and then (the cookie
        // the printed URL sets in another tab lets this page in again)
        show("off", "disconnected: open the URL primefs serve printed");
        window.setTimeout(connect, 5000);
      });
      source.addEventListener("patch", (message) => {
        if (message.lastEventId) lastId = message.lastEventId;
        apply(JSON.parse(message.data));
      });
    }
    connect();
  }
  for (const el of document.querySelectorAll("[data-sse]")) follow(el);
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
