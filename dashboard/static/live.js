// The live page: prepend each event from the shared EventSource (dashboard.js) to the feed.
(function () {
  "use strict";
  var feed = document.getElementById("feed");
  var state = document.getElementById("feed-state");
  var MAX = 500;
  document.addEventListener("hf-state", function (e) { state.textContent = e.detail; });
  document.addEventListener("hf-event", function (e) {
    var item = e.detail;
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
    window.hfLocalTimes(li);
    while (feed.children.length > MAX) { feed.lastElementChild.remove(); }
  });
})();
