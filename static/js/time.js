// Show every <time> in the viewer's own time zone: titles get the full local
// time, clock-style times become local HH:MM. Runs again after htmx swaps.
(function () {
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.title = d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
      if (el.dataset.format === "clock") {
        el.textContent = d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localize(e.target); });
})();
