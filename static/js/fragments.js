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
})();
