// Every page: local times, and one EventSource on the event stream. An OOM alert shows the
// banner; on the live page (#feed) every event is prepended to the feed; the overview refreshes
// its numbers. One script, so that no event or state change can arrive before its listener exists.
(function () {
  "use strict";
  var MAX_ITEMS = 500;
  function localTimes(root) {
    root.querySelectorAll("time[data-ts]").forEach(function (el) {
      var ts = parseFloat(el.dataset.ts);
      if (ts > 0) { el.textContent = new Date(ts * 1000).toLocaleTimeString(); }
    });
  }
  localTimes(document);

  var banner = document.getElementById("oom-banner");
  var dismiss = document.getElementById("oom-dismiss");
  if (dismiss) { dismiss.addEventListener("click", function () { banner.hidden = true; }); }
  var feed = document.getElementById("feed");
  var state = document.getElementById("feed-state");

  function prepend(item) {
    var empty = document.getElementById("feed-empty");
    if (empty) { empty.remove(); }
    var li = document.createElement("li");
    li.className = item.severity + " fresh";
    li.dataset.kind = item.kind;
    li.dataset.id = item.id;
    var time = document.createElement("time");
    time.dataset.ts = item.ts;
    var title = document.createElement("strong");
    title.textContent = item.title;
    li.append(time, " ", title, " ", item.text);
    feed.prepend(li);
    localTimes(li);
    while (feed.children.length > MAX_ITEMS) { feed.lastElementChild.remove(); }
  }

  // Pages with data-refresh (the overview) re-render their <main> from the server a second after
  // an event arrives, and every data-refresh seconds (tier memory is sampled on a timer).
  var refreshS = parseFloat(document.body.dataset.refresh || "0");
  var pending = null;
  function refresh() {
    fetch(window.location.href, { cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        if (fresh) { document.querySelector("main").replaceWith(fresh); localTimes(fresh); }
      })
      .catch(function () {})
      .finally(function () { pending = null; });
  }
  function soon() { if (refreshS > 0 && pending === null) { pending = setTimeout(refresh, 1000); } }
  if (refreshS > 0) { setInterval(soon, refreshS * 1000); }

  if (!window.EventSource) { return; }
  var after = document.body.dataset.lastEvent || "";
  var source = new EventSource("/dashboard/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  source.addEventListener("open", function () { if (state) { state.textContent = "live"; } });
  source.addEventListener("error", function () { if (state) { state.textContent = "reconnecting…"; } });
  source.addEventListener("hf", function (message) {
    var item = JSON.parse(message.data);
    if (item.kind === "oom.alert" && banner) {
      document.getElementById("oom-banner-text").textContent = item.text;
      banner.hidden = false;
    }
    if (feed) { prepend(item); }
    soon();
  });
  window.addEventListener("beforeunload", function () { source.close(); });
})();
