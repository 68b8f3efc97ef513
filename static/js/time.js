// Show every <time> in the viewer's zone: the zone they chose (the page's
// <html data-time-zone>), else the browser's own. Absolute times always say
// their zone ("14:54 CET"), never a bare local clock; the server wrote them
// in the chosen zone or UTC, so without this script they are still right.
// Runs again after htmx swaps.
(function () {
  var chosen = document.documentElement.dataset.timeZone || undefined;
  var FORMATS = {
    clock: { hour: "2-digit", minute: "2-digit", timeZoneName: "short" },
    "short": { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short" },
    stamp: { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short" }
  };
  function withZone(options) {
    var copy = {};
    for (var key in options) copy[key] = options[key];
    if (chosen) copy.timeZone = chosen;
    return copy;
  }
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.title = d.toLocaleString(undefined, withZone({ dateStyle: "medium", timeStyle: "long" }));
      var format = FORMATS[el.dataset.format];
      if (format) el.textContent = d.toLocaleString(undefined, withZone(format));
    });
    if (!chosen) {
      var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
      root.querySelectorAll("[data-browser-zone]").forEach(function (el) {
        el.textContent = el.dataset.browserZone === "name" ? zone + " (browser)" : "your browser's zone, " + zone;
      });
    }
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localize(e.target); });
})();
