// Every page: local times, and one EventSource on the live feed. OOM alerts show the banner;
// every event is re-dispatched as "hf-event" for the page's own script (live.js).
(function () {
  "use strict";
  function localTimes(root) {
    root.querySelectorAll("time[data-ts]").forEach(function (el) {
      var ts = parseFloat(el.dataset.ts);
      if (ts > 0) { el.textContent = new Date(ts * 1000).toLocaleTimeString(); }
    });
  }
  window.hfLocalTimes = localTimes;
  localTimes(document);

  var banner = document.getElementById("oom-banner");
  var dismiss = document.getElementById("oom-dismiss");
  if (dismiss) { dismiss.addEventListener("click", function () { banner.hidden = true; }); }

  if (!window.EventSource) { return; }
  var after = document.body.dataset.lastEvent || "";
  var source = new EventSource("/dashboard/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  source.addEventListener("open", function () { document.dispatchEvent(new CustomEvent("hf-state", { detail: "live" })); });
  source.addEventListener("error", function () { document.dispatchEvent(new CustomEvent("hf-state", { detail: "reconnecting" })); });
  source.addEventListener("hf", function (message) {
    var item = JSON.parse(message.data);
    if (item.kind === "oom.alert" && banner) {
      document.getElementById("oom-banner-text").textContent = item.text;
      banner.hidden = false;
    }
    document.dispatchEvent(new CustomEvent("hf-event", { detail: item }));
  });
  window.addEventListener("beforeunload", function () { source.close(); });
})();
