// What the pages' htmx fragments need beyond htmx's own attributes. It lives
// here, not in hx-on attributes or hx-trigger filters, because the
// Content-Security-Policy allows no eval (htmx.config.allowEval is off).
(function () {
  "use strict";

  // data-swap-bad-request: a 400 answer carries the form's errors as a
  // fragment; show it where the fragment goes (htmx drops 4xx bodies).
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (e.detail.xhr.status === 400 && e.target.closest("[data-swap-bad-request]")) {
      e.detail.shouldSwap = true;
      e.detail.isError = false;
    }
  });

  // data-poll-paused-while="selector": the element's poll skips its turn
  // while the element holds a match (an opened <details> would close when
  // the fragment is replaced under the reader).
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail.elt;
    var selector = elt.getAttribute && elt.getAttribute("data-poll-paused-while");
    if (selector && elt.querySelector(selector)) e.preventDefault();
  });

  // Whatever scrolls sideways (a wide table on a phone) can be reached and
  // scrolled with the keyboard: it becomes a tab stop, named by its heading.
  function reachable(root) {
    var boxes = (root.querySelectorAll ? root : document).querySelectorAll(
      "main section, main div, main pre"
    );
    boxes.forEach(function (box) {
      if (box.hasAttribute("tabindex") || box.scrollWidth <= box.clientWidth + 1) return;
      var style = window.getComputedStyle(box);
      if (style.overflowX !== "auto" && style.overflowX !== "scroll") return;
      box.setAttribute("tabindex", "0");
      if (!box.hasAttribute("aria-label") && !box.hasAttribute("aria-labelledby")) {
        var heading = box.closest("section") && box.closest("section").querySelector("h2, h3");
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", heading ? heading.textContent.trim() : "scrollable");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { reachable(document); });
  document.addEventListener("htmx:afterSettle", function (e) { reachable(e.target); });
  window.addEventListener("resize", function () { reachable(document); });

  // The tab title carries the count of incidents needing a person, as the
  // nav does: "(2) Overview · Agent governance".
  document.addEventListener("htmx:afterSwap", function (e) {
    var count = document.getElementById("nav-incidents");
    if (!count) return;
    var needing = parseInt(count.getAttribute("data-needing") || "0", 10);
    var bare = document.title.replace(/^\(\d+\) /, "");
    document.title = needing > 0 ? "(" + needing + ") " + bare : bare;
  });

  // data-focus-after-swap: after an action, focus goes to what it said
  // (a status line), not back to the top of the page.
  document.addEventListener("htmx:afterSettle", function (e) {
    var said = e.target.querySelector && e.target.querySelector("[data-focus-after-swap]");
    if (said) said.focus();
  });
})();
