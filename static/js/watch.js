// The end-user watch page (R7.1–R7.3): stream the committed answer over SSE,
// survive a network drop (reconnect with Last-Event-ID, dedupe by chunk_no),
// acknowledge the highest contiguous chunk rendered, and offer Stop.
(function () {
  "use strict";
  var root = document.getElementById("watch");
  if (!root) return;
  var answer = document.getElementById("answer");
  var stateEl = document.getElementById("watch-state");
  var stopBtn = document.getElementById("stop");
  var chunks = {};          // chunk_no -> text (dedupe: a chunk is rendered once)
  var contiguous = 0;       // highest chunk_no with every earlier chunk present
  var acked = 0;            // highest contiguous chunk acknowledged to the server
  var ackInFlight = false;
  var lastId = 0;           // last SSE id seen (for a manual reconnect)
  var settled = false;
  var source = null;
  var retryTimer = null;

  function setState(text, cls) {
    stateEl.textContent = text;
    stateEl.className = cls || "";
  }

  function render() {
    while (chunks[contiguous + 1] !== undefined) contiguous += 1;
    var parts = [];
    for (var n = 1; n <= contiguous; n++) parts.push(chunks[n]);
    answer.textContent = parts.join("");
    document.getElementById("chunk-count").textContent = String(contiguous);
    sendAck();
  }

  function sendAck() {
    // An onlooker's page has no acks address: only the run's owner acknowledges (R7.2).
    if (!root.dataset.acks || ackInFlight || contiguous <= acked) return;
    var through = contiguous;
    ackInFlight = true;
    fetch(root.dataset.acks, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": root.dataset.csrf },
      body: JSON.stringify({ through: through }),
    }).then(function (r) {
      if (r.ok) {
        acked = Math.max(acked, through);
        document.getElementById("acked").textContent = String(acked);
      } else if (r.status >= 400 && r.status < 500) {
        delete root.dataset.acks;  // refused, not lost: asking again changes nothing
      }
    }).catch(function () { /* offline: the next render or reconnect retries */ })
      .finally(function () {
        ackInFlight = false;
        if (contiguous > acked) setTimeout(sendAck, 500);
      });
  }

  function onEvent(e) {
    if (e.lastEventId) lastId = Math.max(lastId, parseInt(e.lastEventId, 10) || 0);
    var data;
    try { data = JSON.parse(e.data); } catch (err) { return; }
    var m = data.metadata || {};
    if (data.kind === "chunk" && typeof m.chunk_no === "number") {
      if (chunks[m.chunk_no] === undefined) chunks[m.chunk_no] = m.text || "";
      render();
    } else if (data.kind === "settlement") {
      settled = true;
      setState("settled: " + m.outcome, "settled");
      stopBtn.disabled = true;
      if (source) source.close();
    }
  }

  function connect() {
    if (settled) return;
    // A fresh EventSource does not carry Last-Event-ID: pass it in the query.
    var url = root.dataset.events + (lastId ? "?last_event_id=" + lastId : "");
    source = new EventSource(url);
    source.onopen = function () {
      if (!settled) setState(stopRequested ? "stop requested, streaming" : "streaming", "");
    };
    source.onmessage = onEvent;
    source.onerror = function () {
      if (settled) return;
      setState("detached, reconnecting…", "detached");
      if (source && source.readyState === EventSource.CLOSED) {
        // The browser gave up: reconnect ourselves, from the last event seen.
        clearTimeout(retryTimer);
        retryTimer = setTimeout(connect, 1000);
      }
    };
  }

  var stopRequested = false;
  stopBtn.addEventListener("click", function () {
    stopBtn.disabled = true;
    fetch(root.dataset.stop, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": root.dataset.csrf },
    }).then(function (r) {
      if (r.ok) { stopRequested = true; if (!settled) setState("stop requested…", ""); }
      else stopBtn.disabled = settled;
    }).catch(function () { stopBtn.disabled = settled; });
  });

  function drop(why) {
    if (settled) return;
    if (source) source.close();
    source = null;
    setState(why, "detached");
  }

  // The browser knows the network went away before the socket does: detach now,
  // and resubscribe from the last event seen when it is back.
  window.addEventListener("offline", function () { drop("detached, reconnecting…"); });
  window.addEventListener("online", function () {
    if (!settled && !source) connect();
    sendAck();
  });

  connect();
})();
