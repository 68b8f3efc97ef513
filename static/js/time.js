// Show every <time> in the viewer's own time zone: titles get the full local
// time, clock-style times become local HH:MM. Runs again after htmx swaps.
(function () {
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.title = d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
      // Absolute times say their zone ("14:54 CET"), never a bare local clock.
      if (el.dataset.format === "clock") {
        el.textContent = d.toLocaleTimeString(undefined, {
          hour: "2-digit", minute: "2-digit", timeZoneName: "short"
        });
      } else if (el.dataset.format === "stamp") {
        el.textContent = d.toLocaleString(undefined, {
          year: "numeric", month: "short", day: "numeric",
          hour: "2-digit", minute: "2-digit", timeZoneName: "short"
        });
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localize(e.target); });
})();
