// trainmedic console: live updates. Polls the JSON of /console/changes and reloads the page when an
// incident changed, unless the person is typing in a form (then it only says so).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.fetch) { return; }
  var url = live.getAttribute("data-url");
  var since = parseFloat(live.getAttribute("data-since") || "0");
  var count = parseInt(live.getAttribute("data-count") || "0", 10);
  var period = 3000;
  function busy() {
    var el = document.activeElement;
    return el && (el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "TEXTAREA");
  }
  function poll() {
    fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (body) {
      if (body && (body.updated > since || body.count !== count)) {
        live.className = "changed";
        if (!busy()) { window.location.reload(); return; }
      }
      window.setTimeout(poll, period);
    }).catch(function () { window.setTimeout(poll, period * 3); });
  }
  window.setTimeout(poll, period);
})();
