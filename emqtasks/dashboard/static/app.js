// Live updates without a reload: counts from the server-sent events, and the lanes table
// re-read (an HTML fragment the server escaped) at most every 2 s while the page is open.
(function () {
  "use strict";
  var body = document.body;
  var queue = body.getAttribute("data-queue") || "";
  var page = body.getAttribute("data-page");
  var lastFetch = 0;
  function set(id, v) { var el = document.getElementById(id); if (el) el.textContent = String(v); }
  function refreshTable() {
    var box = document.getElementById(page === "lanes" ? "lanes" : "");
    if (!box || Date.now() - lastFetch < 2000) return;
    if (box.contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
    lastFetch = Date.now();
    fetch(box.getAttribute("data-fragment"), {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) box.innerHTML = html; })
      .catch(function () {});
  }
  if (!window.EventSource) return;
  var es = new EventSource("/events?queue=" + encodeURIComponent(queue));
  es.onmessage = function (e) {
    var d = JSON.parse(e.data);
    set("c-pending", d.pending); set("c-active", d.active); set("c-delayed", d.delayed);
    set("c-dead", d.dead); set("c-groups", d.groups); set("c-paused", d.paused ? "(queue paused)" : "");
    body.setAttribute("data-updated", String(d.t));
    refreshTable();
  };
})();
